package server

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/control"
	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
)

// MaxClientsPerDevice is MPS's client limit on Volta and newer GPUs.
const MaxClientsPerDevice = 48

// DefaultDeviceMemory is each emulated GPU's memory unless
// MPSEMU_DEVICE_MEMORY says otherwise (an A100 40GB).
const DefaultDeviceMemory = 40 * cstr.GiB

// ErrBadConfig reports an unusable emulator setting in the environment.
var ErrBadConfig = errors.New("server: bad configuration")

// Config is what a server starts with.
type Config struct {
	PipeDir      string
	PID          int
	UID          uint32
	Devices      []string // UUIDs, in ordinal order
	DeviceMemory uint64
	MaxClients   int
	// SM and Priority apply when no emulated daemon configures the server
	// (the daemon's environment, inherited).
	SM       float64
	Priority int
	// Pinned is the per-device pinned memory limit in bytes (0 = none)
	// until an emulated daemon sends its defaults.
	Pinned []uint64
	// Standalone keeps the server from registering with an emulated
	// daemon, so the daemon sees it as NVIDIA's daemon sees any server it
	// cannot talk to: INITIALIZING for ever (MPSEMU_SERVER_STANDALONE=1).
	// It then writes no server.log lines either.
	Standalone bool
	// FaultReset is how long the server stays FAULT after the last client
	// a fault affected has gone: the time a real server takes to tear its
	// contexts down and reset the devices ("The following devices will be
	// reset"). 0 recovers at once (MPSEMU_FAULT_RESET, default
	// DefaultFaultReset from the environment).
	FaultReset time.Duration
	// BinaryVersion is the CUDA version a 580 server logs at its start
	// with the driver's major (DriverMajor); 0 logs neither, as the
	// emulator does for older generations (no GPU-less machine can show
	// a real server's log): MPSEMU_DRIVER or MPSEMU_DRIVER_VERSION,
	// inherited from the daemon, as the control program reads them.
	BinaryVersion int
	DriverMajor   int
}

// DefaultFaultReset is FaultReset unless MPSEMU_FAULT_RESET says
// otherwise: an emulator choice. It is not measured precisely on a GPU:
// on an H200 the FAULT window was shorter than a 100 ms status poll
// (docs/gpu-probe), so by default the server is ACTIVE again at once;
// hack/gpu-check.sh measures the window when a GPU run happens. Set it to
// exercise a caller that must cope with a server still resetting (new
// clients refused with 807).
const DefaultFaultReset = 0

// ConfigFromEnv reads the server's environment: CUDA_MPS_PIPE_DIRECTORY,
// CUDA_VISIBLE_DEVICES, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// CUDA_MPS_CLIENT_PRIORITY, MPSEMU_DEVICE_MEMORY, MPSEMU_MAX_CLIENTS,
// MPSEMU_FAULT_RESET, MPSEMU_DRIVER and MPSEMU_DRIVER_VERSION (an unknown
// generation is the control program's to refuse: the server then logs as
// the older generations do).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{
		PipeDir:      getenv("CUDA_MPS_PIPE_DIRECTORY"),
		PID:          os.Getpid(),
		UID:          uint32(os.Geteuid()),
		DeviceMemory: DefaultDeviceMemory,
		MaxClients:   MaxClientsPerDevice,
		SM:           100,
		FaultReset:   DefaultFaultReset,
	}
	if cfg.PipeDir == "" {
		cfg.PipeDir = "/tmp/nvidia-mps"
	}
	cfg.Devices = VisibleDevices(getenv("CUDA_VISIBLE_DEVICES"))
	if v := getenv("MPSEMU_DEVICE_MEMORY"); v != "" {
		b, err := ParseSize(v)
		if err != nil || b == 0 {
			return cfg, fmt.Errorf("%w: MPSEMU_DEVICE_MEMORY=%q: want a size such as 40G", ErrBadConfig, v)
		}
		cfg.DeviceMemory = b
	}
	if v := getenv("MPSEMU_MAX_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxClientsPerDevice {
			return cfg, fmt.Errorf("%w: MPSEMU_MAX_CLIENTS=%q: want 1..%d", ErrBadConfig, v, MaxClientsPerDevice)
		}
		cfg.MaxClients = n
	}
	if v := getenv("MPSEMU_FAULT_RESET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Hour {
			return cfg, fmt.Errorf("%w: MPSEMU_FAULT_RESET=%q: want a duration such as 1s (0 to 1h)", ErrBadConfig, v)
		}
		cfg.FaultReset = d
	}
	if v := getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); v != "" {
		if p, n := cstr.Strtod(v); n > 0 && cstr.ValidPercent(p) {
			cfg.SM = p
		}
	}
	cfg.Standalone = getenv("MPSEMU_SERVER_STANDALONE") == "1"
	if g, err := control.SelectGeneration(getenv); err == nil && g.BinaryVersion() != 0 {
		cfg.BinaryVersion, cfg.DriverMajor = g.BinaryVersion(), int(g)
	}
	if v := getenv("CUDA_MPS_CLIENT_PRIORITY"); v == "1" {
		cfg.Priority = 1
	}
	return cfg, nil
}

// VisibleDevices turns CUDA_VISIBLE_DEVICES into device UUIDs as CUDA
// enumerates them: unset (or empty, which getenv cannot tell apart) means one
// device; "GPU-…"/"MIG-…" entries are taken as they are; an index becomes a
// made-up stable UUID; the list ends at the first entry that is neither
// (CUDA ignores the rest), so "-1" means no devices.
func VisibleDevices(env string) []string {
	if env == "" {
		return []string{syntheticUUID(0)}
	}
	var out []string
	for _, f := range strings.Split(env, ",") {
		f = strings.TrimSpace(f)
		switch {
		case strings.HasPrefix(f, "GPU-") || strings.HasPrefix(f, "MIG-"):
			out = append(out, f)
		default:
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 {
				return out
			}
			out = append(out, syntheticUUID(n))
		}
	}
	return out
}

func syntheticUUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

// ParseSize reads a size for the emulator's own settings and the client's
// --alloc: plain bytes or a number with K, M, G or T (binary, optional "i"
// and "B": "8G", "8GiB", "512M", "1.5G").
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	upper := strings.ToUpper(t)
	upper = strings.TrimSuffix(upper, "B")
	upper = strings.TrimSuffix(upper, "I")
	if upper != "" {
		switch upper[len(upper)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			upper = upper[:len(upper)-1]
		}
	}
	if upper == "" || strings.ContainsAny(upper, "+-eEXxPpNnIi") {
		return 0, fmt.Errorf("size %q: %w", s, strconv.ErrSyntax)
	}
	f, err := strconv.ParseFloat(upper, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	v := f * float64(mult)
	if v >= 1<<64 || v < 0 {
		return 0, fmt.Errorf("size %q: %w", s, strconv.ErrRange)
	}
	return uint64(v), nil
}

// ClientDevices is what a client with CUDA_VISIBLE_DEVICES env (has: set
// at all) sees of a server's devices, as positions in devices: unset, all
// of them; else each entry in turn, a full UUID or a unique UUID prefix
// (with "GPU-" or "MIG-"), or an index of the server's devices, which the
// server renumbers 0..n-1 (NVIDIA's MPS guide: an index of the host's
// would be wrong there); the list ends at the first entry that selects
// nothing or a device already listed, as CUDA's does.
func ClientDevices(env string, has bool, devices []string) []int {
	if !has {
		out := make([]int, len(devices))
		for i := range out {
			out[i] = i
		}
		return out
	}
	var out []int
	for _, f := range strings.Split(env, ",") {
		f = strings.TrimSpace(f)
		idx := -1
		if n, err := strconv.Atoi(f); err == nil {
			if n >= 0 && n < len(devices) {
				idx = n
			}
		} else if strings.HasPrefix(f, "GPU-") || strings.HasPrefix(f, "MIG-") {
			for i, u := range devices {
				if u == f || strings.HasPrefix(u, f) {
					if idx >= 0 && u != f {
						idx = -1 // ambiguous prefix
						break
					}
					idx = i
					if u == f {
						break
					}
				}
			}
		}
		if idx < 0 || slices.Contains(out, idx) {
			return out
		}
		out = append(out, idx)
	}
	return out
}

// ClientLimits parses a client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// ("0=8G,1=512M", keys are ordinals of the devices the client sees or
// their UUIDs, values in MPS's loose syntax) into a limit in bytes per
// device of visible (the client's devices, by UUID), 0 where none is
// given. One entry whose key names no device the client sees (an ordinal
// past its devices, a UUID it does not see, anything else) drops every
// limit, as MPS does (NVIDIA measured 96,768 MiB allocatable under a
// 10 GiB cap): the client is then held only by its server's limits.
// Entries without '=' are ignored; of two for one device the later wins.
func ClientLimits(env string, visible []string) []uint64 {
	out := make([]uint64, len(visible))
	if strings.TrimSpace(env) == "" {
		return out
	}
	for _, e := range strings.Split(env, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		idx := slices.Index(visible, k)
		if n, err := strconv.Atoi(k); err == nil {
			idx = n
		}
		if idx < 0 || idx >= len(visible) {
			return make([]uint64, len(visible))
		}
		out[idx] = cstr.ParsePinnedLimit(strings.TrimSpace(v))
	}
	return out
}
