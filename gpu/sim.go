package gpu

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"golang.org/x/sys/unix"
)

// SimSpec describes a simulated host (the `simulate:` section of the config).
type SimSpec struct {
	GPUs  int    // number of GPUs, 1..MaxSimGPUs; 0 means DefaultSimGPUs
	Model string // one of SimModels(); "" means DefaultSimModel
}

// Simulation defaults and limits.
const (
	DefaultSimGPUs  = 2
	DefaultSimModel = "a100-40g"
	MaxSimGPUs      = 64
)

// simModel is a go-nvml mock GPU plus the power envelope the mock lacks,
// so simulated power follows utilisation between idle and board limit.
type simModel struct {
	cfg          gpus.Config
	idleW, maxW  float64
	driver, nvml string
	cuda         int
}

// The drivers differ on purpose: the MPS emulator imitates the control
// daemon of the model's driver (EnvDriverVersion), and only drivers from
// 555 on take -multiuser-server. The default model's driver runs every
// config (the Kubernetes example's multiuser group too); h100-80g's 550
// is a host where multiuser groups cannot start, as on a real one;
// h200-141g's is the driver seen on a real H200 (docs/gpu-probe).
var simModels = map[string]simModel{
	"a100-40g":  {cfg: gpus.A100_SXM4_40GB, idleW: 55, maxW: 400, driver: "570.172.08", nvml: "12.570.172.08", cuda: 12080},
	"h100-80g":  {cfg: gpus.H100_SXM5_80GB, idleW: 70, maxW: 700, driver: "550.163.01", nvml: "12.550.163.01", cuda: 12040},
	"h200-141g": {cfg: gpus.H200_SXM5_141GB, idleW: 75, maxW: 700, driver: "580.159.04", nvml: "13.580.159.04", cuda: 13000},
	"b200-180g": {cfg: gpus.B200_SXM5_180GB, idleW: 120, maxW: 1000, driver: "570.172.08", nvml: "12.570.172.08", cuda: 12080},
}

// SimModels returns the model names a SimSpec accepts, sorted.
func SimModels() []string { return slices.Sorted(maps.Keys(simModels)) }

// SimUUID returns the UUID the simulated GPU with this index has, in NVML's
// format. It is derived from the index alone, so configs, tests and the demo
// can name simulated GPUs, and it is hashed so that short prefixes differ.
func SimUUID(index int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "mpsd simulated GPU %d", index))
	h := hex.EncodeToString(sum[:16])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// Sim is a simulated host: go-nvml's generated mocks (mock.Interface,
// mock.Device) describing the GPUs of a go-nvml mock model (mock/gpus), with
// every NVML method mpsd uses implemented over consistent state, and hooks for
// the emulator and tests to change that state. Give Sim.NVML() to New;
// everything above nvml.Interface then runs as on real hardware. Methods the
// simulation does not implement fall through to the generated mocks, which
// panic naming the method.
//
// go-nvml's mock/server package would build the devices, but it needs
// github.com/google/uuid, which this module does not carry; the facts it
// would serve come from the same gpus.Config here.
//
// It is safe for concurrent use.
type Sim struct {
	lib   *simLib
	model simModel

	mu   sync.Mutex
	devs []*simDevice
	sets map[*simEventSet]struct{} // live event sets
	refs int                       // Init minus Shutdown, as NVML counts it
	// procsFile: where the MPS process table is kept (KeepMPSProcs).
	procsFile string
	// procsKick: tells ServeXidReports's writer that the table changed
	// (nil while no ServeXidReports runs).
	procsKick chan struct{}

	// waiting is closed while some event set is waiting for events, and
	// replaced by an open one when the last set is freed.
	waiting       chan struct{}
	waitingClosed bool
}

// NewSim builds a simulated host. Errors wrap ErrBadSimSpec or
// ErrUnknownModel; the latter lists the models there are.
func NewSim(spec SimSpec) (*Sim, error) {
	n := spec.GPUs
	if n == 0 {
		n = DefaultSimGPUs
	}
	if n < 0 || n > MaxSimGPUs {
		return nil, fmt.Errorf("%w: gpus: %d (want 1..%d)", ErrBadSimSpec, spec.GPUs, MaxSimGPUs)
	}
	name := strings.ToLower(strings.TrimSpace(spec.Model))
	if name == "" {
		name = DefaultSimModel
	}
	model, ok := simModels[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (valid: %s)", ErrUnknownModel, spec.Model, strings.Join(SimModels(), ", "))
	}
	s := &Sim{model: model, sets: map[*simEventSet]struct{}{}, waiting: make(chan struct{})}
	s.lib = &simLib{Interface: &mock.Interface{}, sim: s}
	for i := range n {
		s.devs = append(s.devs, &simDevice{
			Device: &mock.Device{},
			sim:    s,
			cfg:    model.cfg,
			index:  i,
			uuid:   SimUUID(i),
			busID:  fmt.Sprintf("00000000:%02X:00.0", i+1),
			total:  model.cfg.MemoryMB << 20,
			mode:   nvml.COMPUTEMODE_DEFAULT,
			procs:  map[int]simProcess{},
		})
	}
	return s, nil
}

// EnvDriverVersion names, in the MPS emulator's environment, the driver
// version the simulated GPUs report: without MPSEMU_DRIVER the emulated
// control daemon behaves as that driver's does (a 555 or newer one takes
// -multiuser-server, a 550 one runs it as a client).
const EnvDriverVersion = "MPSEMU_DRIVER_VERSION"

// DriverVersion is the driver version the simulated GPUs report
// (SystemGetDriverVersion), to give the MPS emulator as EnvDriverVersion.
func (s *Sim) DriverVersion() string { return s.model.driver }

// NVML returns the simulated library to pass to New.
func (s *Sim) NVML() nvml.Interface { return s.lib }

// XidWatched returns a channel that is closed once an event set is waiting
// for events, i.e. once a Host's Xid watcher has registered its GPUs and
// InjectXid reaches it. After the last event set is freed a new call returns
// a fresh channel, for the next watcher.
func (s *Sim) XidWatched() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// InjectXid raises Xid xid on simulated GPU gpu, as the driver would on a
// hardware fault. The event goes to every event set registered for critical
// Xid events on that GPU and comes out of their Wait, so it travels the same
// path as a real one. pid names the faulting process (0: unknown). Like real
// NVML, an event nobody registered for is lost: that returns an error wrapping
// ErrSimNotWatched.
func (s *Sim) InjectXid(gpu int, xid uint64, pid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	ev := simEvent{
		data: nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid},
		pid:  pid,
	}
	delivered := 0
	for set := range s.sets {
		if set.masks[gpu]&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		select {
		case set.queue <- ev:
			delivered++
		default:
			return fmt.Errorf("gpu: sim: inject Xid %d on GPU %d: event queue full", xid, gpu)
		}
	}
	if delivered == 0 {
		return fmt.Errorf("%w: GPU %d, Xid %d", ErrSimNotWatched, gpu, xid)
	}
	return nil
}

// SetProcessMemory records that process pid holds bytes of memory on GPU
// gpu, replacing what it held before; kind selects the NVML process list it
// appears in. Memory used is the sum over processes, so an allocation beyond
// the card fails with ErrSimOutOfMemory as cudaMalloc would.
func (s *Sim) SetProcessMemory(gpu, pid int, kind ProcessKind, bytes uint64) error {
	if pid <= 0 {
		return fmt.Errorf("gpu: sim: set process memory: bad pid %d", pid)
	}
	if kind != ProcessCompute && kind != ProcessMPSClient {
		return fmt.Errorf("gpu: sim: set process memory: bad process kind %d", int(kind))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	used := d.usedLocked() - d.procs[pid].bytes
	if bytes > d.total-used {
		return fmt.Errorf("%w: GPU %d: pid %d wants %d bytes, %d of %d free",
			ErrSimOutOfMemory, gpu, pid, bytes, d.total-used, d.total)
	}
	d.procs[pid] = simProcess{kind: kind, bytes: bytes}
	return nil
}

// SetMPSServer records that MPS server pid runs on GPU gpu with clients
// (client pid → bytes it has allocated on that GPU), replacing what was
// recorded of it before. NVML then lists the server as a compute process
// holding its clients' memory, and each client as an MPS client process
// with its own. The emulated control daemons report their servers so
// (ServeXidReports).
func (s *Sim) SetMPSServer(gpu, pid int, clients map[int]uint64) error {
	if pid <= 0 {
		return fmt.Errorf("gpu: sim: set MPS server: bad pid %d", pid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	if d.mps == nil {
		d.mps = map[int]map[int]uint64{}
	}
	d.mps[pid] = maps.Clone(clients)
	if d.mps[pid] == nil {
		d.mps[pid] = map[int]uint64{}
	}
	return nil
}

// RemoveMPSServer forgets MPS server pid on GPU gpu and its clients.
func (s *Sim) RemoveMPSServer(gpu, pid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	delete(d.mps, pid)
	return nil
}

// RemoveProcess forgets process pid on GPU gpu, freeing its memory. Removing
// a process that is not there is not an error, so an emulator can clean up
// unconditionally.
func (s *Sim) RemoveProcess(gpu, pid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	delete(d.procs, pid)
	return nil
}

// SetUtilization sets the busy ratio (0..1) GPU gpu reports; temperature and
// power follow it.
func (s *Sim) SetUtilization(gpu int, ratio float64) error {
	if !(ratio >= 0 && ratio <= 1) {
		return fmt.Errorf("gpu: sim: utilization %v out of range 0..1", ratio)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.deviceLocked(gpu)
	if err != nil {
		return err
	}
	d.utilPct = uint32(ratio*100 + 0.5)
	return nil
}

func (s *Sim) deviceLocked(gpu int) (*simDevice, error) {
	if gpu < 0 || gpu >= len(s.devs) {
		return nil, fmt.Errorf("%w: simulated GPU %d (host has %d)", ErrUnknownGPU, gpu, len(s.devs))
	}
	return s.devs[gpu], nil
}

// liveLocked reports whether NVML is initialised, as a real library would
// answer ERROR_UNINITIALIZED otherwise.
func (s *Sim) liveLocked() bool { return s.refs > 0 }

// simLib is the simulated nvml.Interface. Every method mpsd calls is its
// own rather than a XxxFunc of the embedded mock: the generated mocks record
// every call and would grow without bound in a long-running simulated daemon.
type simLib struct {
	*mock.Interface
	sim *Sim
}

var _ nvml.Interface = (*simLib)(nil)

func (l *simLib) Init() nvml.Return {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	l.sim.refs++
	return nvml.SUCCESS
}

func (l *simLib) InitWithFlags(uint32) nvml.Return { return l.Init() }

func (l *simLib) Shutdown() nvml.Return {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	if l.sim.refs == 0 {
		return nvml.ERROR_UNINITIALIZED
	}
	l.sim.refs--
	return nvml.SUCCESS
}

func (l *simLib) SystemGetDriverVersion() (string, nvml.Return) {
	return l.sim.model.driver, nvml.SUCCESS
}
func (l *simLib) SystemGetNVMLVersion() (string, nvml.Return) { return l.sim.model.nvml, nvml.SUCCESS }
func (l *simLib) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return l.sim.model.cuda, nvml.SUCCESS
}

func (l *simLib) DeviceGetCount() (int, nvml.Return) {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	if !l.sim.liveLocked() {
		return 0, nvml.ERROR_UNINITIALIZED
	}
	return len(l.sim.devs), nvml.SUCCESS
}

func (l *simLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return l.findDevice(func(d *simDevice) bool { return d.index == i })
}

func (l *simLib) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	return l.findDevice(func(d *simDevice) bool { return d.uuid == uuid })
}

func (l *simLib) DeviceGetHandleByPciBusId(busID string) (nvml.Device, nvml.Return) {
	return l.findDevice(func(d *simDevice) bool { return strings.EqualFold(d.busID, busID) })
}

func (l *simLib) findDevice(match func(*simDevice) bool) (nvml.Device, nvml.Return) {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	if !l.sim.liveLocked() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	for _, d := range l.sim.devs {
		if match(d) {
			return d, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_INVALID_ARGUMENT
}

func (l *simLib) EventSetCreate() (nvml.EventSet, nvml.Return) {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	if !l.sim.liveLocked() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	set := &simEventSet{
		sim:   l.sim,
		queue: make(chan simEvent, 64),
		freed: make(chan struct{}),
		masks: map[int]uint64{},
	}
	l.sim.sets[set] = struct{}{}
	return set, nvml.SUCCESS
}

// The library-level forms of the device methods the simulation implements,
// so either calling style sees the same state.

func (l *simLib) EventSetWait(set nvml.EventSet, ms uint32) (nvml.EventData, nvml.Return) {
	return set.Wait(ms)
}
func (l *simLib) EventSetFree(set nvml.EventSet) nvml.Return { return set.Free() }
func (l *simLib) DeviceRegisterEvents(d nvml.Device, mask uint64, set nvml.EventSet) nvml.Return {
	return d.RegisterEvents(mask, set)
}
func (l *simLib) DeviceGetSupportedEventTypes(d nvml.Device) (uint64, nvml.Return) {
	return d.GetSupportedEventTypes()
}
func (l *simLib) DeviceGetMemoryInfo(d nvml.Device) (nvml.Memory, nvml.Return) {
	return d.GetMemoryInfo()
}
func (l *simLib) DeviceGetMemoryInfo_v2(d nvml.Device) (nvml.Memory_v2, nvml.Return) {
	return d.GetMemoryInfo_v2()
}
func (l *simLib) DeviceGetUtilizationRates(d nvml.Device) (nvml.Utilization, nvml.Return) {
	return d.GetUtilizationRates()
}
func (l *simLib) DeviceGetTemperature(d nvml.Device, s nvml.TemperatureSensors) (uint32, nvml.Return) {
	return d.GetTemperature(s)
}
func (l *simLib) DeviceGetPowerUsage(d nvml.Device) (uint32, nvml.Return) {
	return d.GetPowerUsage()
}
func (l *simLib) DeviceGetComputeRunningProcesses(d nvml.Device) ([]nvml.ProcessInfo, nvml.Return) {
	return d.GetComputeRunningProcesses()
}
func (l *simLib) DeviceGetMPSComputeRunningProcesses(d nvml.Device) ([]nvml.ProcessInfo, nvml.Return) {
	return d.GetMPSComputeRunningProcesses()
}
func (l *simLib) DeviceGetComputeMode(d nvml.Device) (nvml.ComputeMode, nvml.Return) {
	return d.GetComputeMode()
}
func (l *simLib) DeviceSetComputeMode(d nvml.Device, m nvml.ComputeMode) nvml.Return {
	return d.SetComputeMode(m)
}

type simProcess struct {
	kind  ProcessKind
	bytes uint64
}

// simDevice is one simulated GPU: fixed facts from its gpus.Config, and live
// state guarded by Sim.mu. The embedded mock.Device only answers methods the
// simulation does not implement.
type simDevice struct {
	*mock.Device
	sim   *Sim
	cfg   gpus.Config
	index int
	uuid  string
	busID string
	total uint64

	mode    nvml.ComputeMode
	utilPct uint32
	procs   map[int]simProcess
	// mps: the MPS servers on the device, by pid, with their clients'
	// memory there (client pid → bytes), as the emulator reports them
	// (SetMPSServer).
	mps map[int]map[int]uint64
}

var _ nvml.Device = (*simDevice)(nil)

func (d *simDevice) usedLocked() uint64 {
	var used uint64
	for _, p := range d.procs {
		used += p.bytes
	}
	for _, clients := range d.mps {
		for _, b := range clients {
			used += b
		}
	}
	return used
}

// locked runs f under Sim.mu, or answers ERROR_UNINITIALIZED as NVML does
// outside Init..Shutdown.
func (d *simDevice) locked(f func() nvml.Return) nvml.Return {
	d.sim.mu.Lock()
	defer d.sim.mu.Unlock()
	if !d.sim.liveLocked() {
		return nvml.ERROR_UNINITIALIZED
	}
	return f()
}

// The fixed facts need no lock, but answer ERROR_UNINITIALIZED outside
// Init..Shutdown all the same so a call after Shutdown shows up in tests.

func (d *simDevice) GetIndex() (int, nvml.Return) {
	return d.index, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetMinorNumber() (int, nvml.Return) {
	return d.index, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetUUID() (string, nvml.Return) {
	return d.uuid, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetName() (string, nvml.Return) {
	return d.cfg.Name, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetBrand() (nvml.BrandType, nvml.Return) {
	return d.cfg.Brand, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return d.cfg.Architecture, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	return d.cfg.CudaMajor, d.cfg.CudaMinor, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	p := nvml.PciInfo{PciDeviceId: d.cfg.PciDeviceId, Bus: uint32(d.index + 1)}
	putCString(p.BusId[:], d.busID)
	putCString(p.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:00.0", 0, d.index+1))
	return p, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

// GetMigMode reports MIG disabled on models that have MIG profiles: mpsd
// shares whole GPUs through MPS, and the simulation never partitions them.
func (d *simDevice) GetMigMode() (int, int, nvml.Return) {
	ret := d.locked(func() nvml.Return {
		if len(d.cfg.MIGProfiles.GpuInstanceProfiles) == 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.SUCCESS
	})
	return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, ret
}

func (d *simDevice) GetMemoryInfo() (m nvml.Memory, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		used := d.usedLocked()
		m = nvml.Memory{Total: d.total, Used: used, Free: d.total - used}
		return nvml.SUCCESS
	})
	return m, ret
}

func (d *simDevice) GetMemoryInfo_v2() (m nvml.Memory_v2, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		used := d.usedLocked()
		m = nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: d.total, Used: used, Free: d.total - used}
		return nvml.SUCCESS
	})
	return m, ret
}

func (d *simDevice) GetUtilizationRates() (u nvml.Utilization, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		u = nvml.Utilization{Gpu: d.utilPct}
		if d.total > 0 {
			// NVML's memory figure is the share of time memory was read
			// or written; the sim ties it to how busy the SMs are.
			u.Memory = d.utilPct / 2
		}
		return nvml.SUCCESS
	})
	return u, ret
}

func (d *simDevice) GetTemperature(sensor nvml.TemperatureSensors) (t uint32, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		if sensor != nvml.TEMPERATURE_GPU {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		t = 30 + d.utilPct/2
		return nvml.SUCCESS
	})
	return t, ret
}

func (d *simDevice) GetPowerUsage() (mw uint32, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		w := d.sim.model.idleW + (d.sim.model.maxW-d.sim.model.idleW)*float64(d.utilPct)/100
		mw = uint32(w * 1000)
		return nvml.SUCCESS
	})
	return mw, ret
}

func (d *simDevice) processes(kind ProcessKind) (list []nvml.ProcessInfo, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		list = []nvml.ProcessInfo{}
		for pid, p := range d.procs {
			if p.kind == kind {
				list = append(list, nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: p.bytes})
			}
		}
		for server, clients := range d.mps {
			if unix.Kill(server, 0) == unix.ESRCH {
				// Gone without a report (its daemon was killed): the
				// driver forgets a process's contexts when it exits.
				delete(d.mps, server)
				continue
			}
			// An MPS server holds the contexts of all its clients: the
			// compute list shows it with their memory; the MPS list shows
			// each client with its own (docs/emulator.md).
			var sum uint64
			for pid, b := range clients {
				sum += b
				if kind == ProcessMPSClient {
					list = append(list, nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: b})
				}
			}
			if kind == ProcessCompute {
				list = append(list, nvml.ProcessInfo{Pid: uint32(server), UsedGpuMemory: sum})
			}
		}
		slices.SortFunc(list, func(a, b nvml.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
		return nvml.SUCCESS
	})
	return list, ret
}

func (d *simDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.processes(ProcessCompute)
}

func (d *simDevice) GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.processes(ProcessMPSClient)
}

func (d *simDevice) GetComputeMode() (m nvml.ComputeMode, ret nvml.Return) {
	ret = d.locked(func() nvml.Return {
		m = d.mode
		return nvml.SUCCESS
	})
	return m, ret
}

func (d *simDevice) SetComputeMode(m nvml.ComputeMode) nvml.Return {
	return d.locked(func() nvml.Return {
		if m < nvml.COMPUTEMODE_DEFAULT || m >= nvml.COMPUTEMODE_COUNT {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		d.mode = m
		return nvml.SUCCESS
	})
}

const simEventTypes = nvml.EventTypeXidCriticalError

func (d *simDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	return simEventTypes, d.locked(func() nvml.Return { return nvml.SUCCESS })
}

func (d *simDevice) RegisterEvents(mask uint64, es nvml.EventSet) nvml.Return {
	return d.locked(func() nvml.Return {
		set, ok := es.(*simEventSet)
		if !ok || set.sim != d.sim {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if _, live := d.sim.sets[set]; !live {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if mask&^uint64(simEventTypes) != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		set.masks[d.index] |= mask
		return nvml.SUCCESS
	})
}

type simEvent struct {
	data nvml.EventData
	pid  int
}

// simEventSet delivers injected events. masks is guarded by Sim.mu; the
// queue and freed channels synchronise themselves.
type simEventSet struct {
	sim     *Sim
	queue   chan simEvent
	freed   chan struct{}
	masks   map[int]uint64
	lastPID atomic.Int64
}

var _ nvml.EventSet = (*simEventSet)(nil)

func (e *simEventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	e.sim.mu.Lock()
	if _, live := e.sim.sets[e]; live && !e.sim.waitingClosed {
		close(e.sim.waiting)
		e.sim.waitingClosed = true
	}
	e.sim.mu.Unlock()
	// Queued events win over an already expired timeout, as in NVML.
	select {
	case <-e.freed:
		return nvml.EventData{}, nvml.ERROR_INVALID_ARGUMENT
	case ev := <-e.queue:
		e.lastPID.Store(int64(ev.pid))
		return ev.data, nvml.SUCCESS
	default:
	}
	timer := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer timer.Stop()
	select {
	case ev := <-e.queue:
		e.lastPID.Store(int64(ev.pid))
		return ev.data, nvml.SUCCESS
	case <-e.freed:
		return nvml.EventData{}, nvml.ERROR_INVALID_ARGUMENT
	case <-timer.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (e *simEventSet) lastEventPID() int { return int(e.lastPID.Load()) }

var _ eventPIDSource = (*simEventSet)(nil)

func (e *simEventSet) Free() nvml.Return {
	e.sim.mu.Lock()
	defer e.sim.mu.Unlock()
	if _, live := e.sim.sets[e]; !live {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	delete(e.sim.sets, e)
	close(e.freed)
	if len(e.sim.sets) == 0 && e.sim.waitingClosed {
		e.sim.waiting = make(chan struct{})
		e.sim.waitingClosed = false
	}
	return nvml.SUCCESS
}

func (e *simEventSet) Wait_v3(uint32) (nvml.EventSetWaitData_v3, nvml.Return) {
	return nvml.EventSetWaitData_v3{}, nvml.ERROR_NOT_SUPPORTED
}

func (e *simEventSet) GetContextCount_v1() (nvml.GetContextCount_v1, nvml.Return) {
	return nvml.GetContextCount_v1{}, nvml.ERROR_NOT_SUPPORTED
}

func (e *simEventSet) GetContextData_v1(d nvml.GetContextData_v1) (nvml.GetContextData_v1, nvml.Return) {
	return d, nvml.ERROR_NOT_SUPPORTED
}

func (e *simEventSet) GetContextInfo_v1(uint32) (nvml.GetContextInfo_v1, nvml.Return) {
	return nvml.GetContextInfo_v1{}, nvml.ERROR_NOT_SUPPORTED
}

func (e *simEventSet) GetGpuOperationalEventContextLegacyXid_v1(uint32) (uint32, nvml.Return) {
	return 0, nvml.ERROR_NOT_SUPPORTED
}

func (e *simEventSet) RegisterGpuOperationalEvents_v1(*nvml.GpuOperationalEventConfig_v1) nvml.Return {
	return nvml.ERROR_NOT_SUPPORTED
}

// putCString copies s into a NUL-terminated C char array, truncating.
func putCString(dst []int8, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = int8(s[i])
	}
	dst[n] = 0
}
