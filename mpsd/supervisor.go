package mpsd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mpsd/mpsd/mps"
)

// Each instance has one supervisor goroutine (supervise), started with the
// instance and ending when the instance is stopped for good or mpsd stops.
// It alone does the instance's life-cycle work, one piece at a time: the
// bring-up (start or adopt the daemon, with retries), each recovery (revoke
// the victims, restart what the fault needs), each probe, and the stop of
// the daemon (to restart it for a changed start option, for good when the
// instance left the config, or for mpsctl shutdown). Two of these never
// overlap, so none has to guess what another is doing.
//
// Others only ask: reportFault records the fault and steps an instance
// that is up (or has its daemon while starting) to recovering at once (it
// takes no new lease from then on), a stop request is left in stopReq, and
// both kick the supervisor. Both also cut a probe under way short, so what
// they ask waits for no probe timeout.
//
// Besides the supervisor, an instance has short-lived workers it does not
// wait for: the reader of the daemon's events (watchInstance, one per
// daemon handle, ending when the handle closes), the caps checks and the
// reconciliations. Each goes through Daemon.spawn and stops on mpsd's
// cancel. The probes of every instance are timed by one clock
// (probeClock), so that an idle mpsd wakes once a probe interval, not once
// per instance.

// supAction is the supervisor's next piece of work.
type supAction uint8

const (
	// supWait: nothing is due; wait for a kick, a probe tick or mpsd's stop.
	supWait supAction = iota
	// supStop: stop the daemon (stopReq), then start a new one or end.
	supStop
	// supRecover: handle the pending fault.
	supRecover
	// supExit: the instance is stopped for good; the supervisor ends.
	supExit
)

func (a supAction) String() string {
	switch a {
	case supWait:
		return "wait"
	case supStop:
		return "stop"
	case supRecover:
		return "recover"
	case supExit:
		return "exit"
	}
	return fmt.Sprintf("supAction(%d)", uint8(a))
}

// supervisorNext decides the supervisor's next piece of work from the
// instance's lifecycle, whether a fault waits for a recovery and whether a
// stop is asked for. It is pure:
//
//	| lifecycle  | fault pending | stop asked | next    |
//	|------------|---------------|------------|---------|
//	| stopped    | any           | any        | exit    |
//	| stopping   | any           | yes        | stop    |
//	| recovering | yes           | any        | recover |
//	| any other  |               |            | wait    |
//
// A stop is asked only of an instance stepped to stopping, which takes no
// fault any more (reportFault drops it); a fault is pending on a starting
// instance only while it has no daemon, and the bring-up, which owns the
// supervisor then, hands it on as a recovery once it has one.
func supervisorNext(c lifecycle, faultPending, stopAsked bool) supAction {
	switch {
	case c == instStopped:
		return supExit
	case c == instStopping && stopAsked:
		return supStop
	case c == instRecovering && faultPending:
		return supRecover
	}
	return supWait
}

// stopRequest asks an instance's supervisor to stop its daemon; the
// instance is stepped to stopping by whoever asks, under Daemon.mu.
type stopRequest struct {
	dm control
	// restart: a new daemon starts after this one stopped (a start
	// option changed); else the instance is gone.
	restart bool
	why     string
	// done, if set, gets the stop's outcome.
	done chan stopResult
}

type stopResult struct {
	rep mps.StopReport
	err error
}

// kickLocked wakes the instance's supervisor (under Daemon.mu); a kick
// already waiting is enough.
func (in *instance) kickLocked() {
	select {
	case in.kick <- struct{}{}:
	default:
	}
}

// takePendingLocked takes the faults pending on in for one recovery:
// they are being handled (in.handling, whose server.log lines the state
// file keeps until the recovery has marked its victims revoking).
func (in *instance) takePendingLocked() []fault {
	pending := in.pending
	in.pending, in.handling, in.handlingMarked = nil, pending, false
	return pending
}

// askStopLocked steps the instance to stopping and has its supervisor
// stop dm (under Daemon.mu). False: the instance cannot stop now (it is
// not up).
func (in *instance) askStopLocked(req *stopRequest) bool {
	if _, err := in.step(instEvStop, req.why); err != nil {
		return false
	}
	in.stopReq = req
	if in.probeCancel != nil {
		in.probeCancel()
	}
	in.kickLocked()
	return true
}

// supervise is the instance's supervisor goroutine (see above).
func (d *Daemon) supervise(in *instance) {
	d.supervisors.Add(1)
	defer d.supervisors.Add(-1)
	defer close(in.done)
	d.bringUpOrRetire(in, true)
	for {
		d.mu.Lock()
		next := supervisorNext(in.life, len(in.pending) > 0, in.stopReq != nil)
		if d.ctx.Err() != nil && next != supStop {
			// A stop already asked for is still done: the instance is
			// empty (a retirement, a restart for a changed start option,
			// mpsctl shutdown), and the next mpsd would not know a retired
			// daemon. Nothing else is begun once mpsd stops.
			next = supExit
		}
		switch next {
		case supExit:
			stopped := in.life == instStopped
			if !stopped {
				for _, f := range in.pending {
					in.unhandledLocked(f)
				}
			}
			d.mu.Unlock()
			if stopped {
				d.releaseShm(in) // shm.go
			}
			return
		case supStop:
			req := in.stopReq
			in.stopReq = nil
			d.mu.Unlock()
			if d.stopInstance(in, req) && d.ctx.Err() == nil {
				// (Once mpsd stops, the next one starts the new daemon.)
				d.bringUpOrRetire(in, false)
			}
			continue
		case supRecover:
			pending := in.takePendingLocked()
			d.mu.Unlock()
			d.recoverOnce(in, pending)
			d.mu.Lock()
			in.handling = nil
			if len(in.pending) == 0 && in.daemon != nil && in.life == instRecovering {
				// Every fault that came meanwhile is handled too. Without a
				// daemon (mpsd stopped before one answered) it stays
				// recovering: the next mpsd takes it up.
				if eff, err := in.step(instEvRecovered, "faults handled"); err == nil && eff&effSchedule != 0 {
					d.scheduleLocked(in.group)
				}
				// Its last lease may have gone during the recovery.
				d.retireIfEmptyLocked(in)
			}
			d.mu.Unlock()
			continue
		}
		tick := d.probes.next()
		d.mu.Unlock()
		select {
		case <-d.ctx.Done():
		case <-in.kick:
		case <-tick:
			d.mu.Lock()
			wd := d.cfg.Watchdog
			d.mu.Unlock()
			d.probe(in, wd.ProbeTimeout, wd.ProbeFailures)
			d.checkShm(in) // shm.go
		}
	}
}

// bringUpOrRetire brings the daemon up; an instance that left the config
// meanwhile, and has no lease, is then retired.
func (d *Daemon) bringUpOrRetire(in *instance, adopt bool) {
	d.bringUp(in, adopt)
	d.mu.Lock()
	d.retireIfEmptyLocked(in)
	d.mu.Unlock()
}

// probeClock ticks every probe interval for every instance's supervisor:
// one timer for all, whose tick closes the channel the supervisors wait on.
type probeClock struct {
	mu sync.Mutex
	ch chan struct{}
}

// next is the channel closed at the next tick.
func (c *probeClock) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

func (c *probeClock) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

// runProbeClock ticks d.probes every watchdog.probe_interval (as the
// config says now) until mpsd stops.
func (d *Daemon) runProbeClock() {
	d.mu.Lock()
	interval := d.cfg.Watchdog.ProbeInterval
	d.mu.Unlock()
	t := d.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C():
		}
		d.probes.tick()
		d.mu.Lock()
		if now := d.cfg.Watchdog.ProbeInterval; now != interval {
			interval = now
			t.Reset(interval)
		}
		d.mu.Unlock()
	}
}

// stopInstance stops the daemon a stop request names and steps the
// instance on: to starting again (true: the caller brings a new daemon
// up) or to stopped.
func (d *Daemon) stopInstance(in *instance, req *stopRequest) (bringUp bool) {
	var res stopResult
	if req.dm != nil {
		res = d.stopDaemon(in, req)
	}
	d.mu.Lock()
	ev := instEvGone
	if req.restart {
		ev = instEvRestart
	}
	eff, err := in.step(ev, "daemon stopped")
	d.mu.Unlock()
	if req.done != nil {
		req.done <- res
	}
	return err == nil && eff&effBringUp != 0
}

// stopDaemon stops and closes the daemon req names. The stop outlives
// mpsd's cancel: the daemon quits gracefully (its instance is empty), not
// killed for want of time.
func (d *Daemon) stopDaemon(in *instance, req *stopRequest) stopResult {
	var res stopResult
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 30*time.Second)
	res.rep, res.err = req.dm.Stop(ctx)
	cancel()
	_ = req.dm.Close()
	in.log.Info("control daemon stopped", "why", req.why, "graceful", res.rep.Graceful, "killed_servers", len(res.rep.KilledServers), "err", res.err)
	return res
}

// probeNeedsCommandLocked reports whether in's next probe must send its
// daemon a command, which NVIDIA's daemon logs, whatever its process
// looks like, with watchdog.probe_command_every at every (the others only
// check its process, control.Check). NVIDIA's daemon logs four records,
// 221 bytes, in control.log for every command: a command each probe (the
// default; 2 s) writes 110 B/s per idle instance, 9.5 MB a day; one every
// twelfth 9.2 B/s, under a tenth (TestProbesWriteATenthOfControlLog), at
// the cost of finding a daemon that runs but no longer answers up to
// every-1 probe intervals later (a stopped or dead daemon is found as soon
// as before). A command is sent every every-th probe (to find a daemon that runs
// but no longer answers, to learn servers from its list, to see its log
// carry the command back: loglost.go), every probe after a failed one,
// and every probe while the log is lost (the daemon then writes nothing).
// A probe also sends one while the last command's record has not come
// back in control.log (probe), so a log that stops carrying them is
// counted lost as fast from there as when every probe sent one.
func (in *instance) probeNeedsCommandLocked(every int) bool {
	return in.quietProbes+1 >= every || in.probeFails > 0 || in.logLostLocked()
}

// probe asks the instance's daemon whether it answers, if the instance is
// up; failures in a row past the configured count mark the daemon hung. A
// fault reported meanwhile cuts the probe short, and an interrupted probe
// counts for nothing. With watchdog.probe_command_every above 1 most probes
// send no command (probeNeedsCommandLocked):
// they read the daemon's process state, and one that finds it stopped or
// gone sends the command at once, so a stopped daemon counts its failures
// as fast as when every probe sent one, and a dead one is the pidfd's to
// report (supervisor's daemon_exit) as always.
func (d *Daemon) probe(in *instance, timeout time.Duration, failures int) {
	d.mu.Lock()
	dm := in.daemon
	if in.life != instUp || dm == nil {
		d.mu.Unlock()
		return
	}
	quiet := !in.probeNeedsCommandLocked(d.cfg.Watchdog.ProbeCommandEvery)
	d.mu.Unlock()
	if quiet {
		// Stopped or gone, or the last command's record still out: the
		// command finds out, as every probe did.
		_, unlogged := dm.LogSilentSince()
		quiet = unlogged == 0 && dm.Check() == nil
	}
	if quiet {
		d.mu.Lock()
		if in.daemon == dm {
			in.quietProbes++
		}
		d.mu.Unlock()
		d.reconcileSoon(in, false) // reconcile.go
		return
	}
	d.mu.Lock()
	if in.life != instUp || in.daemon != dm {
		d.mu.Unlock()
		return
	}
	in.quietProbes = 0
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	in.probeCancel = cancel
	d.mu.Unlock()
	err := dm.Probe(ctx)
	d.mu.Lock()
	in.probeCancel = nil
	if d.ctx.Err() != nil || errors.Is(ctx.Err(), context.Canceled) || in.daemon != dm {
		d.mu.Unlock()
		return
	}
	in.ringLocked() // a release waiting while the daemon did not answer
	if err == nil {
		in.probeFails = 0
		caps := !in.capsProbing
		in.capsProbing = true
		d.mu.Unlock()
		d.localResourceOK(whereProbe)
		// The daemon answers: its servers' caps are checked too, by a
		// worker, so that a fault meanwhile waits for no MPS command.
		capsDone := func() {
			d.mu.Lock()
			in.capsProbing = false
			d.mu.Unlock()
		}
		if caps && !d.spawn(func() { defer capsDone(); d.probeCaps(in, dm) }) {
			capsDone()
		}
		d.checkLog(in, dm)         // loglost.go
		d.reconcileSoon(in, false) // reconcile.go
		return
	}
	if isLocalResource(err) {
		// mpsd could not run the probe at all (out of descriptors or
		// processes): that is mpsd's failure and says nothing of the
		// daemon, so it does not count towards a hung-daemon restart.
		d.mu.Unlock()
		d.localResourceError(whereProbe, err)
		in.log.Warn("probe not run: mpsd is out of local resources; not counted against the daemon", "err", err)
		return
	}
	in.probeFails++
	n := in.probeFails
	d.mu.Unlock()
	in.log.Warn("probe failed", "failures_in_a_row", n, "err", err)
	if n >= failures {
		f := fault{kind: faultHung, restart: restartDaemon,
			reason: fmt.Sprintf("MPS control daemon of group %s on GPU %d stopped answering (%d probes failed)", in.group, in.gpus[0].Index, n)}
		d.chargeUnlessLogLost(in, dm, &f, false)
		d.reportFault(in, f)
	}
}
