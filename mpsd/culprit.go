package mpsd

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/mpsd/mpsd/policy"
)

// Culprits. A fault that names the lease whose client caused it (an
// application Xid whose faulting process is one of that lease's, a fact
// the driver reports and no tenant can write) charges that lease alone:
// only its requeue uses up an attempt, its victims (the other clients of
// the server, which MPS gave a sticky error too) are requeued without
// spending theirs, and the failure counts towards a quarantine of the
// culprit's uid on the instance, not of the instance: quarantine_after
// such faults of one uid within quarantine_window bar that uid from the
// instance until the window has passed since its last fault (or an
// operator resumes the instance), while the group's other members go on
// using it. A fault that names no culprit (a server's crash, a fault MPS
// logged with an Xid that names no process, as NVML's do on real GPUs)
// is charged as before: every victim uses up an attempt and the failure
// counts towards the instance's quarantine. A log line naming a culprit
// is never taken for one: anyone who can reach the pipe directory can
// write it.

// uidBar is a uid barred from an instance for its clients' faults.
type uidBar struct {
	until  time.Time
	reason string
}

// culprits returns the uids of the culprits fs name, each with the reason
// of its latest fault, and whether one of fs names none (anonymous).
func culprits(fs []fault) (uids map[uint32]string, anonymous bool) {
	for _, f := range fs {
		if f.culprit.lease == "" {
			anonymous = true
			continue
		}
		if uids == nil {
			uids = map[uint32]string{}
		}
		uids[f.culprit.uid] = f.reason
	}
	return uids, anonymous
}

// chargeCulpritsLocked counts a failure at now for each culprit uid on
// in, and bars one that has had wd.QuarantineAfter of them within
// wd.QuarantineWindow. It returns the uids barred now.
func (in *instance) chargeCulpritsLocked(uids map[uint32]string, now time.Time, wd policy.WatchdogConfig) []uint32 {
	var barred []uint32
	for _, uid := range slices.Sorted(maps.Keys(uids)) {
		if in.uidFailures == nil {
			in.uidFailures = map[uint32][]time.Time{}
		}
		keep := in.uidFailures[uid][:0]
		for _, t := range in.uidFailures[uid] {
			if now.Sub(t) < wd.QuarantineWindow {
				keep = append(keep, t)
			}
		}
		in.uidFailures[uid] = append(keep, now)
		n := len(in.uidFailures[uid])
		if n < wd.QuarantineAfter {
			continue
		}
		if in.barred == nil {
			in.barred = map[uint32]uidBar{}
		}
		in.barred[uid] = uidBar{until: now.Add(wd.QuarantineWindow),
			reason: fmt.Sprintf("%d faults of uid %d's clients in %s%s%s", n, uid, wd.QuarantineWindow, lastFailure, uids[uid])}
		barred = append(barred, uid)
	}
	return barred
}

// barredUIDs are the uids barred from in at now, sorted.
func (in *instance) barredUIDs(now time.Time) []uint32 {
	if len(in.barred) == 0 {
		return nil
	}
	var out []uint32
	for uid, b := range in.barred {
		if now.Before(b.until) {
			out = append(out, uid)
		}
	}
	slices.Sort(out)
	return out
}

// liftBarsLocked forgets every bar of in and the failures behind them
// (mpsctl resume).
func (in *instance) liftBarsLocked() {
	in.barred, in.uidFailures = nil, nil
}

// barNotesLocked says, for each uid that an instance of group bars at
// now, which of them do and why (a queued lease's wait reason adds it);
// nil when none bars anyone, as on almost every call: it is made on every
// change of the group's queue.
func (d *Daemon) barNotesLocked(group string, now time.Time) map[uint32]string {
	any := false
	for _, in := range d.instances {
		any = any || in.group == group && len(in.barred) > 0
	}
	if !any {
		return nil
	}
	var notes map[uint32]string
	for _, in := range d.groupInstancesLocked(group) { // in a stable order
		for _, uid := range in.barredUIDs(now) {
			b := in.barred[uid]
			if notes == nil {
				notes = map[uint32]string{}
			}
			if notes[uid] != "" {
				notes[uid] += "; "
			}
			notes[uid] += fmt.Sprintf("GPU %s refuses uid %d until %s (%s)", gpuList(in), uid, b.until.Format(time.TimeOnly), b.reason)
		}
	}
	return notes
}

// reopenAfterBar schedules in's group again once the bar of uid lapses,
// so that the barred uid's queued requests are placed then.
func (d *Daemon) reopenAfterBar(in *instance, until time.Time) {
	d.spawn(func() {
		t := d.clock.NewTimer(until.Sub(d.clock.Now()))
		defer t.Stop()
		select {
		case <-t.C():
		case <-d.ctx.Done():
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		d.scheduleLocked(in.group)
	})
}
