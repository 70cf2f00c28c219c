package mpsd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mpsd/mpsd/internal/mpsenv"
	"github.com/mpsd/mpsd/mps"
)

// The caps of a group on each MPS server of its instances, as metrics
// name them (mpsd_mps_cap_drift_total's cap label).
const (
	capThreads = "thread_percentage"
	capPinned  = "pinned_memory"
)

var capKinds = []string{capThreads, capPinned}

// How long a server that has just started is waited for to become ready
// before its caps are first checked; the probes check it from then on.
const (
	capsStartWait    = 10 * time.Second
	capsStartBackoff = 20 * time.Millisecond
)

// The caps of each server. The group's caps (max_sm, max_mem) are the
// daemon's defaults, which a new server starts with, and the ceiling of
// every server. In a group without multiuser each server is one uid's, so
// mpsd holds it to that uid's leases (capsWantLocked): the largest share
// (per process) and memory limit among the uid's running leases on the
// instance, raised before a grant that needs more is told to its launcher
// (capsForGrantLocked) and lowered at the next check once leases end.
// A client cannot raise its own limits above its server's (MPS lets the
// environment only lower them), so no client gets more than its uid was
// granted in one lease, whatever its environment says. A shared
// (multiuser) server serves every member: its caps stay the group's, and
// the shares are advisory within them.
//
// MPS also lets a server's owner change its own server's limits
// (set_active_thread_percentage <pid>, and on a daemon without the 550
// privilege check even the defaults), and in a group without multiuser that
// owner is the tenant. So mpsd checks every server it has verified (a
// child of the daemon, mps.ServerStarted) as soon as it is ready, and again
// at every probe: a cap that differs from what mpsd last set (or, on a new
// server, from the daemon's defaults as mpsd last set them) is a drift,
// logged with the group, GPU and server and counted in
// mpsd_mps_cap_drift_total; whatever differs from what the server should
// have now is set. The instance's caps commands run one at a time
// (instance.capsMu).

// serverCaps are a server's limits as mpsd holds them: thread percentage
// and the pinned memory limit of each of its devices.
type serverCaps struct {
	sm  float64
	mem int64
}

// capsWantLocked is what a server of uid (-1: unknown) on in should allow
// now: on a server that is not shared, the largest per-process share and
// memory among uid's running leases (capped by the group's caps); on a
// shared server, or one of unknown uid, the group's caps. ok is false
// when uid has no running lease there: the server keeps what it has.
func (in *instance) capsWantLocked(uid int) (c serverCaps, ok bool) {
	group := serverCaps{sm: float64(in.maxSM), mem: in.maxMem}
	if in.p.Multiuser || uid < 0 {
		return group, true
	}
	for _, l := range in.leases {
		if l.uid != uint32(uid) || l.state != leaseRunning {
			continue
		}
		pct, err := mpsenv.WorkerPercentage(l.req.SM, l.req.Clients())
		if err != nil {
			pct = l.req.SM
		}
		c.sm = max(c.sm, float64(pct))
		c.mem = max(c.mem, l.req.Mem)
	}
	if c.sm == 0 {
		return serverCaps{}, false
	}
	return serverCaps{sm: min(c.sm, group.sm), mem: min(c.mem, group.mem)}, true
}

// newServerCapsLocked is what a server that starts now on in allows: the
// daemon's defaults, as mpsd last set them (the group's caps until then).
func (in *instance) newServerCapsLocked() serverCaps {
	return in.mps.newServerCaps(serverCaps{sm: float64(in.maxSM), mem: in.maxMem})
}

// capsForGrantLocked: l has just been placed on in, whose daemon is not
// shared. It returns what must be done, without Daemon.mu and before the
// grant is told to the launcher, so that l's clients get what l's uid was
// granted and no more: the caps of each live server of l's uid set to
// capsWantLocked, or, when none runs, the daemon's defaults set to it (MPS
// starts l's client's server with them; one daemon serves one uid at a
// time, so the next server it starts is l's uid's). nil: nothing to do.
func (d *Daemon) capsForGrantLocked(in *instance, l *lease) func() {
	if in.p.Multiuser || in.daemon == nil {
		return nil
	}
	dm := in.daemon
	want, _ := in.capsWantLocked(int(l.uid))
	var pids []int
	uidServes := false
	for pid, uid := range in.mps.serverUIDs() {
		if uid != int(l.uid) {
			continue
		}
		uidServes = true
		if set, ok := in.mps.capsOf(pid); !ok || set != want {
			pids = append(pids, pid)
		}
	}
	var setDefaults bool
	var inFlight chan struct{}
	if !uidServes {
		if in.newServerCapsLocked() != want {
			setDefaults = true
		} else {
			inFlight = in.mps.defaultsInFlight() // the same defaults, being set
		}
	}
	if len(pids) == 0 && !setDefaults && inFlight == nil {
		return nil
	}
	devices := len(in.gpus)
	timeout := d.cfg.Watchdog.ProbeTimeout
	var setting defaultsSetting
	if setDefaults {
		// Recorded now, so that the grants placed while the command runs
		// wait for it instead of each setting them again.
		setting = in.mps.beginDefaults(want)
	}
	return func() {
		for _, pid := range pids {
			if err := d.enforceCaps(in, dm, pid, "grant"); err != nil && !errors.Is(err, mps.ErrServerNotReady) && !errors.Is(err, mps.ErrServerNotFound) {
				in.log.Warn("could not set an MPS server's caps for a grant", "server", pid, "lease", l.id, "err", err)
			}
		}
		if inFlight != nil {
			select {
			case <-inFlight:
			case <-d.ctx.Done():
			}
			d.mu.Lock()
			held := in.mps.defaultsHold(want) // a later grant may have raised them
			d.mu.Unlock()
			if !held {
				in.log.Warn("the MPS daemon's defaults for this grant were not set; its new server starts with the previous ones until a check sets them", "lease", l.id)
			}
		}
		if !setDefaults {
			return
		}
		defer close(setting.done)
		in.capsMu.Lock()
		defer in.capsMu.Unlock()
		// The newest decision, which a later grant may have made while
		// this one waited: the commands land in the order of the
		// decisions, whatever order their goroutines run in.
		d.mu.Lock()
		target, current := in.mps.defaultsTarget(), in.daemon == dm
		d.mu.Unlock()
		if !current || target == nil {
			return // the daemon was replaced: its successor starts with the group's caps
		}
		ctx, cancel := context.WithTimeout(d.ctx, timeout)
		defer cancel()
		err := dm.SetDefaults(ctx, target.sm, target.mem, devices)
		d.mu.Lock()
		in.mps.endDefaults(setting, target, err)
		d.mu.Unlock()
		if err != nil {
			in.log.Warn("could not set the MPS daemon's defaults for a grant; its new server starts with the previous ones until a check sets them", "lease", l.id, "err", err)
		}
	}
}

// serverStartedCaps checks the caps of a server that has just started
// once it is ready, retrying while it initializes or a command fails (bounded by
// capsStartWait; the probes take over then). It runs in a goroutine of
// the daemon.
func (d *Daemon) serverStartedCaps(in *instance, dm control, pid int) {
	deadline := d.clock.Now().Add(capsStartWait)
	backoff := capsStartBackoff
	t := d.clock.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C():
		}
		d.mu.Lock()
		_, live := in.mps.uidOf(pid)
		current := in.daemon == dm
		d.mu.Unlock()
		if !live || !current {
			return
		}
		err := d.enforceCaps(in, dm, pid, "server start")
		switch {
		case err == nil:
			in.log.Debug("MPS server's caps checked at its start", "server", pid)
			return
		case errors.Is(err, mps.ErrServerNotFound):
			return // it exited meanwhile
		}
		// Initializing, or a daemon slow to answer (it serves one
		// session at a time): tried again until the deadline.
		if d.clock.Now().After(deadline) {
			in.log.Debug("MPS server's caps not checked at its start; the next probes check them", "server", pid, "err", err)
			return
		}
		t.Reset(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// probeCaps checks the caps of every verified server of the instance, as
// part of a probe.
func (d *Daemon) probeCaps(in *instance, dm control) {
	d.mu.Lock()
	pids := in.mps.pids()
	d.mu.Unlock()
	for _, pid := range pids {
		if d.ctx.Err() != nil {
			return
		}
		err := d.enforceCaps(in, dm, pid, "probe")
		if err != nil && !errors.Is(err, mps.ErrServerNotReady) && !errors.Is(err, mps.ErrServerNotFound) {
			in.log.Warn("could not check an MPS server's caps", "server", pid, "err", err)
		}
	}
}

// enforceCaps reads server pid's caps, counts and logs a drift (a cap
// that differs from what mpsd last set on it, or on a new server from the
// group's), and sets what differs from what the server should allow now
// (capsWantLocked). It returns the commands' error (ErrServerNotReady
// while the server initializes).
func (d *Daemon) enforceCaps(in *instance, dm control, pid int, when string) error {
	in.capsMu.Lock()
	defer in.capsMu.Unlock()
	d.mu.Lock()
	uid, known := in.mps.uidOf(pid)
	last, seen := in.mps.capsOf(pid)
	if !seen {
		last = in.newServerCapsLocked()
	}
	want, ok := in.capsWantLocked(uid)
	if !ok {
		want = last // no lease of its uid: it keeps what it has
	}
	devices := len(in.gpus)
	timeout := d.cfg.Watchdog.ProbeTimeout
	d.mu.Unlock()
	if !known {
		return nil
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	caps, err := dm.ServerCaps(ctx, pid, devices)
	if err != nil {
		return err
	}
	var drifts []string
	if !mps.SamePercent(caps.ThreadPercentage, last.sm) {
		drifts = append(drifts, capThreads)
		in.log.Warn("MPS server's cap drifted from what mpsd set; setting it back",
			"server", pid, "server_uid", uid, "cap", capThreads, "want", want.sm, "got", caps.ThreadPercentage, "seen_at", when)
	}
	pinnedDrift, pinnedOff := false, false
	for dev, got := range caps.PinnedMem {
		if got != mps.ReportedPinnedMem(last.mem) {
			pinnedDrift = true
			in.log.Warn("MPS server's cap drifted from what mpsd set; setting it back",
				"server", pid, "server_uid", uid, "cap", capPinned, "device", dev, "want", fmtSize(want.mem), "got", fmtSize(got), "seen_at", when)
		}
		pinnedOff = pinnedOff || got != mps.ReportedPinnedMem(want.mem)
	}
	if pinnedDrift {
		drifts = append(drifts, capPinned)
	}
	d.mu.Lock()
	if len(drifts) > 0 {
		if in.capDrifts == nil {
			in.capDrifts = map[string]uint64{}
		}
		for _, c := range drifts {
			in.capDrifts[c]++
		}
	}
	if !pinnedOff && mps.SamePercent(caps.ThreadPercentage, want.sm) {
		in.mps.noteCaps(pid, want)
		d.mu.Unlock()
		return nil
	}
	d.mu.Unlock()
	mem := make([]int64, devices)
	for i := range mem {
		mem[i] = want.mem
	}
	if _, err := dm.SetServerCaps(ctx, pid, want.sm, mem); err != nil {
		if errors.Is(err, mps.ErrServerNotFound) {
			return err // it exited meanwhile: nothing to hold to the caps
		}
		in.log.Error("could not set an MPS server's caps; the next probe tries again", "server", pid, "server_uid", uid, "err", err)
		return fmt.Errorf("set caps of server %d: %w", pid, err)
	}
	d.mu.Lock()
	in.mps.noteCaps(pid, want)
	d.mu.Unlock()
	in.log.Info("MPS server's caps set", "server", pid, "server_uid", uid, "sm", want.sm, "mem", fmtSize(want.mem), "seen_at", when)
	return nil
}
