package mpsd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mpsd/mpsd/mps"
)

// Each instance of a group the kubelet device plugin serves has a private
// /dev/shm (docs/cluster.md): a tmpfs of its own, sized by the group's
// shm_size, mounted on Layout.ShmDir when its control daemon starts
// (mps.PrivateShm, mps.MountShm) and bound on the daemon's /dev/shm, and
// so its servers' and its pods'. A pod fills at most that tmpfs, never
// run_dir's file system, on which every control daemon of the host keeps
// its pipe directory. Here:
//
//   - checkShm, at every probe tick of the instance's supervisor, reads
//     its usage (mpsd_shm_used_bytes, mpsd_shm_size_bytes, mpsd_shm_full),
//     logs when it fills up and when it no longer is full, applies a
//     changed shm_size, and empties a full one once no pod of the instance
//     runs: no lease of it (a pod's lease lives while its allocation does)
//     and no MPS server of it left (a server exits with its last client),
//     so nothing a running tenant holds is taken from it;
//   - releaseShm, when the instance stops for good, unmounts it and
//     removes its directory;
//   - sweepShmLocked, whenever the instance set is made to match the
//     config (at start and on reload), unmounts the private /dev/shm of
//     every instance mpsd does not run (one a crash of mpsd left between
//     a daemon's stop and its unmount).
//
// The tmpfs outlives mpsd (its daemon and servers run on): a restarted
// mpsd adopts the daemon and finds its tmpfs where it was, and one whose
// daemon is started anew reuses it (mps.MountShm).

// shmNS is the mount namespace the private /dev/shm tmpfs are mounted in:
// PID 1's, where the kubelet and the container runtime resolve the host
// paths they bind into pods, also when mpsd runs in a namespace of its own
// (a systemd unit with ProtectSystem=, whose mounts never reach the host;
// a container with the host's PID namespace). mpsd's own namespace must
// receive that namespace's mounts (a systemd unit's does; a container's
// run_dir volume needs mountPropagation: HostToContainer).
var shmNS = "/proc/1/ns/mnt"

// shmNSUnread is logged once: PID 1's mount namespace cannot be read.
var shmNSUnread sync.Once

// shmMountNS is shmNS, or "" (mpsd's own namespace) when mpsd may not read
// it (a sandbox that hides PID 1): then it could not enter it either, and
// a runtime in another namespace gives pods the directory below the
// tmpfs, which they cannot write (mps.MountShm), rather than run_dir.
func (d *Daemon) shmMountNS() string {
	if _, err := os.Readlink(shmNS); err != nil {
		shmNSUnread.Do(func() {
			d.log.Warn("PID 1's mount namespace is unreadable: private /dev/shm tmpfs are mounted in mpsd's own, which the container runtime must share", "ns", shmNS, "err", err)
		})
		return ""
	}
	return shmNS
}

// shmState is what the last check of an instance's private /dev/shm found
// (checkShm), for its metrics and its log lines; guarded by Daemon.mu.
type shmState struct {
	// known: usage was read (a tmpfs is mounted); the metrics show it.
	known bool
	usage mps.ShmUsage
	full  bool
	// cleaned counts the times a full one was emptied.
	cleaned uint64
	// resizeRefused is the size a resize to was refused, so it is logged
	// once, not at every check.
	resizeRefused int64
	// checks counts the checks that read it.
	checks uint64
}

// servesShmLocked reports whether the daemons of group run with a private
// /dev/shm (the kubelet device plugin serves the group).
func (d *Daemon) servesShmLocked(group string) bool {
	return d.opts.PrivateShm != nil && d.opts.PrivateShm(group)
}

// shmSizeLocked is the configured size of the private /dev/shm of the
// group's instances.
func (d *Daemon) shmSizeLocked(group string) int64 {
	if g, ok := d.cfg.Group(group); ok && g.ShmSize > 0 {
		return g.ShmSize
	}
	return 64 << 20 // the schema's default
}

// shmMountLocked is the private /dev/shm the instance's daemon starts
// with (mpsConfig).
func (d *Daemon) shmMountLocked(in *instance) mps.ShmMount {
	return mps.ShmMount{Dir: d.layout.ShmDir(in.group, in.gpus[0].UUID), Size: d.shmSizeLocked(in.group), NS: d.shmMountNS()}
}

// shmCleanable is the cleaning rule: a full private /dev/shm is emptied
// only while no lease of its instance runs and no MPS server of it is
// left. One that is not full is left alone: what is in it may be a pod's
// whose lease is being replaced after a fault, and it is bounded anyway.
func shmCleanable(full bool, leases, servers int) bool {
	return full && leases == 0 && servers == 0
}

// pageRound rounds n bytes up to whole pages, as tmpfs does its size.
func pageRound(n int64) uint64 {
	p := int64(os.Getpagesize())
	return uint64((n + p - 1) / p * p)
}

// checkShm checks the instance's private /dev/shm (see above). It runs in
// the instance's supervisor, so no start or stop of the daemon, nor its
// mount or unmount, runs meanwhile.
func (d *Daemon) checkShm(in *instance) {
	d.mu.Lock()
	served, known := d.servesShmLocked(in.group), in.shm.known
	size := d.shmSizeLocked(in.group)
	dir := d.layout.ShmDir(in.group, in.gpus[0].UUID)
	d.mu.Unlock()
	if !served && !known {
		return
	}
	u, err := mps.ReadShmUsage(dir)
	if err != nil {
		// Not mounted (yet): the daemon has not started, or was adopted
		// from an mpsd that gave it none.
		if !errors.Is(err, mps.ErrShmNotMounted) {
			in.log.Warn("private /dev/shm unreadable", "dir", dir, "err", err)
		}
		d.mu.Lock()
		in.shm.known, in.shm.full = false, false
		d.mu.Unlock()
		return
	}
	if served && u.Size != pageRound(size) {
		d.mu.Lock()
		refused := in.shm.resizeRefused == size
		d.mu.Unlock()
		if !refused {
			if err := mps.ResizeShm(dir, size); err != nil {
				in.log.Warn("private /dev/shm not resized to the group's shm_size; tried again once its files are gone", "dir", dir, "shm_size", size, "size_bytes", u.Size, "used_bytes", u.Used, "err", err)
				d.mu.Lock()
				in.shm.resizeRefused = size
				d.mu.Unlock()
			} else {
				in.log.Info("private /dev/shm resized to the group's shm_size", "dir", dir, "shm_size", size, "was_bytes", u.Size)
				if nu, err := mps.ReadShmUsage(dir); err == nil {
					u = nu
				}
			}
		}
	}
	d.mu.Lock()
	was := in.shm.full
	in.shm.known, in.shm.usage, in.shm.full = true, u, u.Full()
	in.shm.checks++
	leases, servers := len(in.leases), len(in.mps.pids())
	d.mu.Unlock()
	switch {
	case u.Full() && !was:
		in.log.Warn("private /dev/shm full: shared memory allocations of the instance's MPS servers, clients and pods fail; it is emptied once no lease of the instance runs and no server of it is left (raise the group's shm_size if its pods need more)",
			"dir", dir, "used_bytes", u.Used, "size_bytes", u.Size, "inodes", u.Inodes, "inodes_free", u.InodesFree, "leases", leases, "servers", servers)
	case !u.Full() && was:
		in.log.Info("private /dev/shm no longer full", "dir", dir, "used_bytes", u.Used, "size_bytes", u.Size)
	}
	if shmCleanable(u.Full(), leases, servers) {
		d.cleanShm(in, dir, u)
	}
}

// cleanShm empties the instance's full private /dev/shm.
func (d *Daemon) cleanShm(in *instance, dir string, before mps.ShmUsage) {
	removed, err := mps.CleanShm(dir)
	after, rerr := mps.ReadShmUsage(dir)
	if err != nil {
		in.log.Error("emptying the full private /dev/shm failed", "dir", dir, "removed", removed, "err", err)
	} else {
		in.log.Warn("private /dev/shm emptied: it was full and no pod of the instance runs (no lease, no MPS server)", "dir", dir, "removed", removed, "freed_bytes", before.Used-min(before.Used, after.Used))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if removed > 0 {
		in.shm.cleaned++
	}
	if rerr == nil {
		in.shm.usage, in.shm.full = after, after.Full()
	}
}

// releaseShm unmounts the private /dev/shm of an instance that stopped
// for good and removes its directory. A daemon or pod that still had it
// keeps its own mount until it ends; nothing new gets it.
func (d *Daemon) releaseShm(in *instance) {
	dir := d.layout.ShmDir(in.group, in.gpus[0].UUID)
	unmounted, err := mps.UnmountShm(dir, d.shmMountNS())
	d.mu.Lock()
	in.shm.known, in.shm.full = false, false
	d.mu.Unlock()
	switch {
	case err != nil:
		in.log.Error("private /dev/shm of the stopped instance not removed", "dir", dir, "err", err)
	case unmounted:
		in.log.Info("private /dev/shm unmounted and removed: the instance stopped", "dir", dir)
	}
}

// sweepShmLocked unmounts and removes every private /dev/shm under run_dir
// that belongs to no instance mpsd runs (under Daemon.mu: no instance is
// added meanwhile). One of an instance mpsd runs is left for its daemon.
func (d *Daemon) sweepShmLocked() {
	mounts, err := mps.ShmMountsUnder(d.layout.RunDir)
	if err != nil {
		d.log.Warn("private /dev/shm mounts under run_dir not listed", "run_dir", d.layout.RunDir, "err", err)
		return
	}
	if len(mounts) == 0 {
		return
	}
	ours := map[string]bool{}
	for _, in := range d.instances {
		ours[d.layout.ShmDir(in.group, in.gpus[0].UUID)] = true
	}
	for _, dir := range mounts {
		// Only <run_dir>/<group>/<gpu>/shm is an instance's.
		rel, err := filepath.Rel(d.layout.RunDir, dir)
		if parts := strings.Split(rel, "/"); ours[dir] || err != nil || len(parts) != 3 || parts[2] != mps.ShmDirName {
			continue
		}
		if _, err := mps.UnmountShm(dir, d.shmMountNS()); err != nil {
			d.log.Error("stale private /dev/shm not removed", "dir", dir, "err", err)
			continue
		}
		d.log.Info("stale private /dev/shm removed: no instance mpsd runs has it", "dir", dir)
	}
}
