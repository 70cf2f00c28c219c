package mpsd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

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

// The group's caps (max_sm, max_mem) are the daemon's defaults, which a
// new server starts with; MPS lets a server's owner change its own
// server's limits (set_active_thread_percentage <pid>, and on a daemon
// without the 550 privilege check even the defaults), and in a group
// without multiuser that owner is the tenant. So mpsd checks every server
// it has verified (a child of the daemon, mps.ServerStarted) as soon as it
// is ready, and again at every probe, and sets back a cap that differs:
// a drift, logged with the group, GPU and server and counted in
// mpsd_mps_cap_drift_total.

// serverStartedCaps checks the caps of a server that has just started
// once it is ready, retrying while it initializes (bounded by
// capsStartWait; the probes take over then). It runs in a goroutine of
// the daemon.
func (d *Daemon) serverStartedCaps(in *instance, dm *mps.Daemon, pid int) {
	deadline := time.Now().Add(capsStartWait)
	backoff := capsStartBackoff
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		_, live := in.servers[pid]
		current := in.daemon == dm
		d.mu.Unlock()
		if !live || !current {
			return
		}
		err := d.enforceCaps(in, dm, pid, "server start")
		if err == nil {
			in.log.Debug("MPS server's caps checked at its start", "server", pid)
		}
		if !errors.Is(err, mps.ErrServerNotReady) {
			return
		}
		if time.Now().After(deadline) {
			in.log.Debug("MPS server still initializing; its caps are checked at the next probes", "server", pid)
			return
		}
		t.Reset(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// probeCaps checks the caps of every verified server of the instance, as
// part of a probe.
func (d *Daemon) probeCaps(in *instance, dm *mps.Daemon) {
	d.mu.Lock()
	pids := slices.Sorted(maps.Keys(in.servers))
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

// enforceCaps reads server pid's caps and sets back those that differ
// from the group's, counting and logging each drift. It returns the
// commands' error (ErrServerNotReady while the server initializes).
func (d *Daemon) enforceCaps(in *instance, dm *mps.Daemon, pid int, when string) error {
	d.mu.Lock()
	wantSM, wantMem, devices := float64(in.maxSM), in.maxMem, len(in.gpus)
	uid, known := in.servers[pid]
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
	if !mps.SamePercent(caps.ThreadPercentage, wantSM) {
		drifts = append(drifts, capThreads)
		in.log.Warn("MPS server's cap drifted from the group's; setting it back",
			"server", pid, "server_uid", uid, "cap", capThreads, "want", wantSM, "got", caps.ThreadPercentage, "seen_at", when)
	}
	pinnedDrift := false
	for dev, got := range caps.PinnedMem {
		if got != mps.ReportedPinnedMem(wantMem) {
			pinnedDrift = true
			in.log.Warn("MPS server's cap drifted from the group's; setting it back",
				"server", pid, "server_uid", uid, "cap", capPinned, "device", dev, "want", fmtSize(wantMem), "got", fmtSize(got), "seen_at", when)
		}
	}
	if pinnedDrift {
		drifts = append(drifts, capPinned)
	}
	if len(drifts) == 0 {
		return nil
	}
	d.mu.Lock()
	if in.capDrifts == nil {
		in.capDrifts = map[string]uint64{}
	}
	for _, c := range drifts {
		in.capDrifts[c]++
	}
	d.mu.Unlock()
	mem := make([]int64, devices)
	for i := range mem {
		mem[i] = wantMem
	}
	if _, err := dm.SetServerCaps(ctx, pid, wantSM, mem); err != nil {
		if errors.Is(err, mps.ErrServerNotFound) {
			return err // it exited meanwhile: nothing to hold to the caps
		}
		in.log.Error("could not set an MPS server's caps back to the group's; the next probe tries again", "server", pid, "server_uid", uid, "err", err)
		return fmt.Errorf("set caps of server %d: %w", pid, err)
	}
	in.log.Info("MPS server's caps set back to the group's", "server", pid, "sm", wantSM, "mem", fmtSize(wantMem))
	return nil
}
