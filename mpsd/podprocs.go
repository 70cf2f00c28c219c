package mpsd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
	"github.com/mpsd/mpsd/gpu"
)

// A kubelet device plugin's lease holds no process of its own: the pod's
// processes are the kubelet's, started by the container runtime in cgroups
// of its making. The plugin, which holds the lease as root, learns from
// the kubelet's PodResources API which container holds the lease's units
// and from the runtime (CRI) that container's id and a process of it, and
// binds the lease to them (POST /v1/leases/{id}/pod). mpsd reads the
// container's cgroups from the kernel through that process and keeps only
// those named after the container's id: a process the runtime no longer
// runs (its pid reused since) is in none, and is refused. From then on
// the processes in those cgroups are the lease's, as an mps-launch
// lease's cgroup's are: their device memory is summed and held to the
// lease's memory (checkLeaseMemory), reconciliation joins on them, and
// status shows them. Nothing a pod writes decides it: not its
// environment (MPSD_LEASE_ID and the MPS variables are hints a process
// may copy or change), nor /proc of its own processes (their cgroups are
// the kernel's, and a pod's root cannot move them: the cgroup file system
// is read-only in a container, and host root is refused by the plugin's
// check).
//
// A lease over its memory for memory_grace ends the container's CUDA
// processes: terminate_client on their server first, then SIGKILL through
// a pidfd, each process checked to be in the container's cgroups while
// the pidfd holds it. The lease then ends (api.CodeLimitExceeded, never
// requeued); the kubelet restarts the container, and the plugin asks for
// a new lease for its units and binds it to the new container.

// podTable is the bindings of the device plugin's leases, by lease id.
type podTable struct {
	mu sync.Mutex
	m  map[string]*podBinding
}

// podBinding is a lease's container, as mpsd read it from the kernel.
type podBinding struct {
	ref api.PodContainer
	// paths: per cgroup hierarchy (the key /proc/PID/cgroup names it by:
	// "" for cgroup v2, else the v1 controller list), the container's
	// cgroup, for each hierarchy where it is named after the container's
	// id.
	paths map[string]string
	// dir is where its processes are read from: one of those cgroups
	// under its hierarchy's mount (the unified one when there is one).
	dir string
}

func (t *podTable) get(id string) *podBinding {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

func (t *podTable) set(id string, b *podBinding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*podBinding{}
	}
	t.m[id] = b
}

// keepOnly forgets the bindings of leases not in ids (ended, or no longer
// placed).
func (t *podTable) keepOnly(ids map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id := range t.m {
		if !ids[id] {
			delete(t.m, id)
		}
	}
}

// errPodBinding: the process named is no process of the container named.
var errPodBinding = errors.New("not the container's process")

// bindPod reads, through a pidfd on req.PID, the cgroups of the container
// req names: those of the process whose last element holds the container's
// id. A process that is gone, or in no such cgroup, is refused
// (errPodBinding).
func (d *Daemon) bindPod(req api.BindPodRequest) (*podBinding, error) {
	h, err := openPid(d.proc, req.PID)
	if err != nil {
		return nil, fmt.Errorf("%w: pid %d: %v", errPodBinding, req.PID, err)
	}
	defer h.close()
	lines, err := procCgroups(d.proc, req.PID)
	if err == nil && !h.alive() {
		err = errors.New("it exited")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: pid %d: %v", errPodBinding, req.PID, err)
	}
	b := &podBinding{ref: req.PodContainer, paths: map[string]string{}}
	for key, path := range lines {
		if path != "/" && strings.Contains(filepath.Base(path), req.ContainerID) {
			b.paths[key] = path
		}
	}
	if len(b.paths) == 0 {
		return nil, fmt.Errorf("%w: pid %d is in no cgroup named after container %s (the container ended, or the pid names another process now)", errPodBinding, req.PID, req.ContainerID)
	}
	mounts, err := cgroupMounts(filepath.Join(d.proc, "self", "mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("mpsd: cgroup mounts: %w", err)
	}
	keys := slices.Sorted(maps.Keys(b.paths))
	for _, k := range keys { // "" (cgroup v2) sorts first
		if mp, ok := mounts[k]; ok {
			b.dir = filepath.Join(mp, filepath.Clean(b.paths[k]))
			break
		}
	}
	if b.dir == "" {
		return nil, fmt.Errorf("%w: no hierarchy of container %s's cgroups (%v) is mounted here", errPodBinding, req.ContainerID, keys)
	}
	return b, nil
}

// pids lists the processes of the container's cgroup and of the cgroups
// nested in it; an error when the cgroup is gone (the container ended).
func (b *podBinding) pids() ([]int, error) {
	var out []int
	err := filepath.WalkDir(b.dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if path != b.dir && errors.Is(err, fs.ErrNotExist) {
				return nil // a nested cgroup removed meanwhile
			}
			return err
		}
		if !e.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if path != b.dir && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		for f := range strings.FieldsSeq(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out, err
}

// holds reports whether a process in the cgroups lines (procCgroups) is
// the container's: in each hierarchy where the container's cgroup is named
// after it, in that cgroup or one nested in it.
func (b *podBinding) holds(lines map[string]string) bool {
	for key, want := range b.paths {
		got, ok := lines[key]
		if !ok || got != want && !strings.HasPrefix(got, want+"/") {
			return false
		}
	}
	return true
}

// leasePids is the lease's processes: its cgroup's (livePids) and, for a
// lease bound to a pod's container, that container's.
func (d *Daemon) leasePids(l *lease) []int {
	pids := l.livePids(d.clock)
	if b := d.pods.get(l.id); b != nil {
		if p, err := b.pids(); err == nil {
			pids = append(pids, p...)
		}
	}
	return pids
}

// podRef is the container lease id is bound to; nil for none.
func (d *Daemon) podRef(id string) *api.PodContainer {
	if b := d.pods.get(id); b != nil {
		ref := b.ref
		return &ref
	}
	return nil
}

// serveBindPod binds the caller's running lease to the container a
// BindPodRequest names (api.PodPath). Only root may: a binding decides
// which processes a breach of the lease's limits ends, and root is what
// the kubelet device plugin runs as (a pod's processes are never host
// root: the plugin refuses to start them so).
func (d *Daemon) serveBindPod(w http.ResponseWriter, r *http.Request) {
	p, _, req, ok := openRequest(d, w, r, api.DecodeBindPodRequest)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if p.uid != 0 {
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("uid %d may not bind a lease to a container: only root (the kubelet device plugin) may", p.uid))
		return
	}
	d.mu.Lock()
	l, found := d.leases[id]
	running := found && l.state == leaseRunning
	d.mu.Unlock()
	switch {
	case !callersLease(w, l, found, p.uid, id):
		return
	case !running:
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is not running", id))
		return
	}
	b, err := d.bindPod(req)
	if err != nil {
		status, code := http.StatusUnprocessableEntity, api.CodeRefused
		if !errors.Is(err, errPodBinding) {
			status, code = http.StatusInternalServerError, api.CodeInternal
		}
		d.log.Warn("lease not bound to its pod's container", "lease", id, "namespace", req.Namespace, "pod", req.Pod, "container", req.Container, "container_id", req.ContainerID, "pid", req.PID, "err", err)
		apihttp.WriteError(w, status, code, err.Error())
		return
	}
	d.mu.Lock()
	running = d.leases[id] == l && l.state == leaseRunning
	if running {
		d.pods.set(id, b)
	}
	log := l.logger()
	attrs := l.logAttrs("namespace", req.Namespace, "pod", req.Pod, "container", req.Container, "container_id", req.ContainerID, "cgroup", b.dir)
	d.mu.Unlock()
	if !running {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is not running", id))
		return
	}
	log.Info("lease bound to its pod's container: the container's processes are the lease's", attrs...)
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	_, _ = w.Write([]byte("{}\n"))
}

// podMemoryExceeded is the log message of a pod's container ended for its
// lease's memory (docs/cluster.md).
const podMemoryExceeded = "pod over its lease's memory: its container's CUDA processes are ended"

// endPodClients ends the CUDA processes of lease l's container (b),
// logging to log (l's): the container's processes that NVML lists on the
// instance's GPUs (procs) or a server of it (servers, of dm) lists as its
// client. Each is held by a pidfd and checked first: its cgroups, read
// while the pidfd holds it, show it in the container, and an MPS client
// (whose pid is the one the client gave its server, which another pod's
// client may give too) is proven a client of one of the servers
// (proveClient); a compute process beside MPS is the driver's own pid.
// Then each client MPS lists is terminated by its server (killing a
// client with work in flight can hang the server), and each is killed
// through its pidfd. It returns how many were ended.
func (d *Daemon) endPodClients(l *lease, log *slog.Logger, b *podBinding, dm control, servers []int, procs map[int][]gpu.ProcessMemory) int {
	pids, err := b.pids()
	if err != nil {
		return 0 // the container is gone, and its processes with it
	}
	mine := map[int]bool{}
	for _, pid := range pids {
		mine[pid] = true
	}
	// compute: true for a compute process beside MPS, false for an MPS
	// client; server: the server that lists it as a client.
	compute, server := map[int]bool{}, map[int]int{}
	for _, list := range procs {
		for _, pm := range list {
			if mine[pm.PID] {
				compute[pm.PID] = compute[pm.PID] || pm.Kind == gpu.ProcessCompute
			}
		}
	}
	live := dm != nil && !dm.Exited()
	if live {
		for _, s := range servers {
			ctx, cancel := context.WithTimeout(d.ctx, time.Second)
			clients, err := dm.ClientList(ctx, s)
			cancel()
			if err != nil {
				continue
			}
			for _, c := range clients {
				if mine[c] {
					server[c] = s
					if _, ok := compute[c]; !ok {
						compute[c] = false
					}
				}
			}
		}
	}
	type target struct {
		pid int
		h   *pidHandle
	}
	var targets []target
	defer func() {
		for _, t := range targets {
			t.h.close()
		}
	}()
	for _, pid := range slices.Sorted(maps.Keys(compute)) {
		h, err := openPid(d.proc, pid)
		if err != nil {
			continue // gone already
		}
		lines, err := procCgroups(d.proc, pid)
		switch {
		case !h.alive(), err != nil || !b.holds(lines):
			h.close() // gone, or its pid names another process now
			continue
		case !compute[pid] && !d.provenClient(h, servers):
			log.Warn("a pid listed as a client of the pod's lease is not proven a client of the instance's server; not signalled",
				"pid", pid, "namespace", b.ref.Namespace, "pod", b.ref.Pod, "container", b.ref.Container)
			h.close()
			continue
		}
		targets = append(targets, target{pid, h})
	}
	for _, t := range targets {
		if s := server[t.pid]; s != 0 && live {
			ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
			if err := dm.TerminateClient(ctx, s, t.pid); err != nil {
				log.Warn("terminate_client of a pod's client failed; killing it", "lease", l.id, "pid", t.pid, "server", s, "err", err)
			}
			cancel()
		}
	}
	ended := 0
	for _, t := range targets {
		if d.killPodProcess(log, b, t.pid, t.h) {
			ended++
		}
	}
	return ended
}

// killPodProcess kills the process h holds (pid, of the container b)
// through the pidfd, unless it has ended already, and waits, a few
// seconds at most, for it to be gone; true once it is.
func (d *Daemon) killPodProcess(log *slog.Logger, b *podBinding, pid int, h *pidHandle) bool {
	if !h.alive() {
		return true
	}
	if err := unix.PidfdSendSignal(h.fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		log.Error("killing a pod's CUDA process failed", "pid", pid, "namespace", b.ref.Namespace, "pod", b.ref.Pod, "container", b.ref.Container, "err", err)
		return false
	}
	fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := unix.Poll(fds, 100)
		if n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
		if d.ctx.Err() != nil {
			break
		}
	}
	return !h.alive()
}

// provenClient reports whether the process h holds is a client of one of
// servers (proveClient).
func (d *Daemon) provenClient(h *pidHandle, servers []int) bool {
	for _, s := range servers {
		sh, err := openPid(d.proc, s)
		if err != nil {
			continue
		}
		ok, err := proveClient(d.proc, h, sh)
		sh.close()
		if err == nil && ok {
			return true
		}
	}
	return false
}
