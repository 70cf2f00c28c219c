package mpsenv

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The variables a client's MPS environment consists of.
const (
	VisibleDevices   = "CUDA_VISIBLE_DEVICES"
	PipeDirectory    = "CUDA_MPS_PIPE_DIRECTORY"
	ThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	PinnedMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// Names lists the variables Client.Env sets, in a fixed order.
var Names = []string{VisibleDevices, PipeDirectory, ThreadPercentage, PinnedMemLimit}

var (
	// ErrInvalid: NewDevices or NewClient was given what no client
	// environment can be made of.
	ErrInvalid = errors.New("mpsenv: invalid MPS client environment")
	// ErrFallsOpen: under the environment Check was given, MPS would run
	// the client without (some of) its limits, or could misread them.
	ErrFallsOpen = errors.New("mpsenv: MPS would not hold the client to its limits")
)

// maxDevices bounds a device list (MPS serves at most a host's GPUs).
const maxDevices = 64

// mib is one MiB, the unit of every limit this package writes.
const mib = 1 << 20

// maxMiB bounds a limit (2^43 MiB = 8 EiB), so it always fits an int64 of
// bytes.
const maxMiB = 1 << 43

// Devices is the GPUs a client sees, by full UUID, in the order it
// enumerates them. Only NewDevices makes one.
type Devices struct{ uuids []string }

// NewDevices takes the GPU (or MIG) UUIDs of an MPS server's devices, in the
// order the server enumerates them (its daemon's CUDA_VISIBLE_DEVICES).
func NewDevices(uuids []string) (Devices, error) {
	if len(uuids) == 0 || len(uuids) > maxDevices {
		return Devices{}, fmt.Errorf("%w: %d devices (want 1 to %d)", ErrInvalid, len(uuids), maxDevices)
	}
	for i, u := range uuids {
		if !isUUID(u) {
			return Devices{}, fmt.Errorf("%w: device %d: %q is no GPU or MIG UUID", ErrInvalid, i, u)
		}
		if slices.Contains(uuids[:i], u) {
			return Devices{}, fmt.Errorf("%w: device %s listed twice", ErrInvalid, u)
		}
	}
	return Devices{uuids: slices.Clone(uuids)}, nil
}

// Len is the number of devices.
func (d Devices) Len() int { return len(d.uuids) }

// UUIDs returns the devices' UUIDs in order.
func (d Devices) UUIDs() []string { return slices.Clone(d.uuids) }

// isUUID: "GPU-" or "MIG-" and then only what UUIDs are made of, so the
// value can be neither split nor misparsed where it is listed.
func isUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
	if !ok {
		rest, ok = strings.CutPrefix(s, "MIG-")
	}
	if !ok || rest == "" || len(s) > 128 {
		return false
	}
	for _, c := range rest {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '/':
		default:
			return false
		}
	}
	return true
}

// Client is the MPS environment of one lease's client. Only NewClient
// makes one, so its limits always name exactly the devices it sees.
type Client struct {
	dev     Devices
	pipeDir string
	sm      int
	memMiB  int64
}

// NewClient is the environment of a client on devices dev of the MPS
// daemon at pipeDir, with thread percentage sm (1 to 100) and a pinned
// memory limit of memBytes on every device, rounded down to whole MiB (at
// least 1 MiB).
func NewClient(pipeDir string, dev Devices, sm int, memBytes int64) (Client, error) {
	switch {
	case dev.Len() == 0:
		return Client{}, fmt.Errorf("%w: no devices (use NewDevices)", ErrInvalid)
	case !filepath.IsAbs(pipeDir) || filepath.Clean(pipeDir) != pipeDir || strings.ContainsRune(pipeDir, 0):
		return Client{}, fmt.Errorf("%w: pipe directory %q is not a clean absolute path", ErrInvalid, pipeDir)
	case sm < 1 || sm > 100:
		return Client{}, fmt.Errorf("%w: thread percentage %d (want 1 to 100)", ErrInvalid, sm)
	case memBytes < mib || memBytes/mib >= maxMiB:
		return Client{}, fmt.Errorf("%w: memory limit of %d bytes (want 1 MiB to 8 EiB)", ErrInvalid, memBytes)
	}
	return Client{dev: dev, pipeDir: pipeDir, sm: sm, memMiB: memBytes / mib}, nil
}

// WorkerPercentage is the thread percentage of each of procs client
// processes that share a lease of sm percent: sm/procs, rounded down, so
// that procs processes together never hold more than sm. It fails with an
// error wrapping ErrInvalid when sm is not 1 to 100, procs is below 1, or
// the share would be under 1% (procs above sm): MPS has no smaller share,
// and a percentage of 0 is one it ignores.
func WorkerPercentage(sm, procs int) (int, error) {
	switch {
	case sm < 1 || sm > 100:
		return 0, fmt.Errorf("%w: thread percentage %d (want 1 to 100)", ErrInvalid, sm)
	case procs < 1:
		return 0, fmt.Errorf("%w: %d processes (want 1 or more)", ErrInvalid, procs)
	case procs > sm:
		return 0, fmt.Errorf("%w: %d processes sharing %d%%: each would get under 1%% (at most %d processes)", ErrInvalid, procs, sm, sm)
	}
	return sm / procs, nil
}

// Env is the client's variables (Names), to replace whatever the caller's
// environment holds under those names.
func (c Client) Env() map[string]string {
	limits := make([]string, c.dev.Len())
	for i := range limits {
		limits[i] = strconv.Itoa(i) + "=" + strconv.FormatInt(c.memMiB, 10) + "M"
	}
	return map[string]string{
		VisibleDevices:   strings.Join(c.dev.uuids, ","),
		PipeDirectory:    c.pipeDir,
		ThreadPercentage: strconv.Itoa(c.sm),
		PinnedMemLimit:   strings.Join(limits, ","),
	}
}

// Check says whether MPS would hold a client with environment getenv to
// the limits it names, reading them as MPS does; every error wraps
// ErrFallsOpen and names the variable. It asks for the form NewClient
// writes: a pipe directory; where CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is set,
// CUDA_VISIBLE_DEVICES listing full UUIDs (an index there is the MPS
// server's, which the environment alone cannot resolve) and exactly one
// entry per visible device, keyed by its ordinal or its UUID, valued in
// whole MiB ("NNNM") or GiB ("NNG"); a thread percentage, where set, in
// (0, 100].
func Check(getenv func(string) (string, bool)) error {
	if v, ok := getenv(PipeDirectory); !ok || v == "" {
		return fmt.Errorf("%w: %s is unset: the client would run without MPS, on the whole GPU", ErrFallsOpen, PipeDirectory)
	}
	if v, ok := getenv(ThreadPercentage); ok {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || !(p > 0 && p <= 100) {
			return fmt.Errorf("%w: %s=%q is no percentage in (0, 100]: MPS would ignore it", ErrFallsOpen, ThreadPercentage, v)
		}
	}
	limits, ok := getenv(PinnedMemLimit)
	if !ok {
		return nil
	}
	vis, ok := getenv(VisibleDevices)
	if !ok {
		return fmt.Errorf("%w: %s is set but %s is not: which devices its entries name depends on the MPS server", ErrFallsOpen, PinnedMemLimit, VisibleDevices)
	}
	visible := strings.Split(vis, ",")
	for i, u := range visible {
		if !isUUID(u) {
			return fmt.Errorf("%w: %s entry %d (%q) is no full GPU UUID: an index there is the MPS server's", ErrFallsOpen, VisibleDevices, i, u)
		}
		if slices.Contains(visible[:i], u) {
			return fmt.Errorf("%w: %s lists %s twice", ErrFallsOpen, VisibleDevices, u)
		}
	}
	seen := make([]bool, len(visible))
	for _, e := range strings.Split(limits, ",") {
		k, v, found := strings.Cut(e, "=")
		if !found {
			return fmt.Errorf("%w: %s entry %q has no '='", ErrFallsOpen, PinnedMemLimit, e)
		}
		dev := slices.Index(visible, k)
		if n, err := strconv.Atoi(k); err == nil && k == strconv.Itoa(n) {
			dev = n
		}
		if dev < 0 || dev >= len(visible) {
			return fmt.Errorf("%w: %s entry %q names a device the client does not see (it sees %d): MPS would drop every pinned limit", ErrFallsOpen, PinnedMemLimit, e, len(visible))
		}
		if seen[dev] {
			return fmt.Errorf("%w: %s names device %d twice: MPS takes the later", ErrFallsOpen, PinnedMemLimit, dev)
		}
		seen[dev] = true
		if !wholeUnits(v) {
			return fmt.Errorf("%w: %s entry %q is not whole MiB (NNNM) or GiB (NNG): MPS reads any other suffix as MiB", ErrFallsOpen, PinnedMemLimit, e)
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return fmt.Errorf("%w: %s has no entry for visible device %d (%s)", ErrFallsOpen, PinnedMemLimit, i, visible[i])
	}
	return nil
}

// CheckShare says whether a client with environment getenv is held to a
// thread percentage of at most limit, the share of each process of a
// lease whose SM share is divided among several (WorkerPercentage): the
// variable must be set, since a client without one gets its server's
// default, the whole group's cap. Errors wrap ErrFallsOpen and name the
// variable. Check's other rules still apply; CheckShare adds this one.
func CheckShare(getenv func(string) (string, bool), limit int) error {
	v, ok := getenv(ThreadPercentage)
	if !ok {
		return fmt.Errorf("%w: %s is unset: each process would get its MPS server's default, not its %d%%", ErrFallsOpen, ThreadPercentage, limit)
	}
	p, err := strconv.ParseFloat(v, 64)
	if err != nil || !(p > 0 && p <= float64(limit)) {
		return fmt.Errorf("%w: %s=%q is no percentage in (0, %d]: the lease's processes together could take more than its share", ErrFallsOpen, ThreadPercentage, v, limit)
	}
	return nil
}

// wholeUnits: digits, not all zero and not too many, then M or G.
func wholeUnits(v string) bool {
	n, unit := v[:max(len(v)-1, 0)], v[max(len(v)-1, 0):]
	if unit != "M" && unit != "G" || n == "" || len(n) > 13 {
		return false
	}
	x, err := strconv.ParseUint(n, 10, 64)
	return err == nil && x > 0 && n == strconv.FormatUint(x, 10)
}

// Lookup is a getenv for Check over an environment list ("K=V"); the first
// entry of a name wins, as in libc's getenv.
func Lookup(env []string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				return v, true
			}
		}
		return "", false
	}
}
