package mpsd

import (
	"errors"
	"fmt"
	"net/http"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
	"github.com/mpsd/mpsd/gpu"
)

func adminError(w http.ResponseWriter, err error) {
	status, code := http.StatusNotFound, api.CodeNotFound
	if errors.Is(err, gpu.ErrBadSelector) || errors.Is(err, gpu.ErrAmbiguousSelector) {
		status, code = http.StatusBadRequest, api.CodeBadRequest
	}
	apihttp.WriteError(w, status, code, err.Error())
}

// serveRestart restarts the control daemons of the instances named, as the
// watchdog would after a daemon failure, without counting it towards
// quarantine.
func (d *Daemon) serveRestart(w http.ResponseWriter, r *http.Request) {
	if !d.requireAdmin(w, r) {
		return
	}
	t, ok := readBody(w, r, d.opts.RequestTimeout, api.DecodeAdminTarget)
	if !ok {
		return
	}
	insts, err := d.matchInstances(t)
	if err != nil {
		adminError(w, err)
		return
	}
	res := api.AdminResult{Instances: []api.InstanceStatus{}}
	for _, in := range insts {
		d.reportFault(in, fault{kind: faultAdmin, restart: restartDaemon, admin: true,
			reason: fmt.Sprintf("an administrator restarted MPS for group %s on GPU %d", in.group, in.gpus[0].Index)})
		d.mu.Lock()
		res.Instances = append(res.Instances, in.statusLocked())
		d.mu.Unlock()
		in.log.Info("instance restart requested by admin")
	}
	writeJSON(w, res)
}

// serveRequeue revokes one running lease and requeues it at the head of
// its group's queue; it does not use up one of the lease's attempts.
func (d *Daemon) serveRequeue(w http.ResponseWriter, r *http.Request) {
	if !d.requireAdmin(w, r) {
		return
	}
	q, ok := readBody(w, r, d.opts.RequestTimeout, api.DecodeRequeueRequest)
	if !ok {
		return
	}
	d.mu.Lock()
	l, found := d.leases[q.Lease]
	if !found || l.state != leaseRunning {
		d.mu.Unlock()
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no running lease %s", q.Lease))
		return
	}
	in := l.inst
	reason := "an administrator requeued the lease"
	how := revokeHow{dm: in.daemon, servers: in.mps.pids(), force: true}
	res := api.AdminResult{Instances: []api.InstanceStatus{in.statusLocked()}}
	d.mu.Unlock()
	in.log.Info("lease requeue requested by admin", "lease", l.id)
	// The same sequence as a fault's: revoking is recorded (and written)
	// before the launcher is told or anything is killed.
	if d.revoke([]*lease{l}, reason, how) == 0 {
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no running lease %s (it ended or another revocation took it)", q.Lease))
		return
	}
	writeJSON(w, res)
}

// serveCancel ends a lease for good at its owner's or an admin's request
// (mpsctl cancel): a queued one leaves its queue, a running one is revoked
// (its launcher told, a signal and its grace first when asked, then MPS
// and the kill end its processes) and not requeued. Its launcher gets
// CodeCancelled naming who cancelled it; the answer comes once the lease
// has ended.
func (d *Daemon) serveCancel(w http.ResponseWriter, r *http.Request) {
	p, c, q, ok := openRequest(d, w, r, api.DecodeCancelRequest)
	if !ok {
		return
	}
	who := d.users.who(p.uid, false)
	msg := fmt.Sprintf("lease %s cancelled by %s", q.Lease, who)
	// How a running (or revoking) lease ends: its revocation's end.
	end := api.Error{Code: api.CodeCancelled, Message: msg + "; its command was stopped"}
	d.mu.Lock()
	l, found := d.leases[q.Lease]
	if found && l.uid != p.uid && !d.cfg.Access.Admin(c) {
		d.mu.Unlock()
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("lease %s is not yours (only its owner or an mpsd admin may cancel it)", q.Lease))
		return
	}
	if !found {
		d.mu.Unlock()
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no lease %s (it ended, or never was)", q.Lease))
		return
	}
	switch l.state {
	case leaseQueued:
		group := l.group
		d.dequeueAsLocked(l, api.EndedCancelled, "cancelled by "+who)
		d.store.request()
		d.scheduleLocked(group) // the requests behind it may fit now
		l.box.push(api.Event{Type: api.EventError, Code: api.CodeCancelled, Message: msg + " while it was queued"})
		d.mu.Unlock()
		d.awaitRecorded(r.Context(), l) // answered once the history has it
		d.log.Info("queued lease cancelled", "lease", l.id, "group", group, "job", l.jobID, "by", who)
		writeJSON(w, api.CancelResult{Lease: q.Lease, Was: api.LeaseQueued})
		return
	case leaseRunning:
	case leaseRevoking:
		// A fault's (or an operator's requeue's) revocation has it: it
		// ends with the cancel instead of being requeued, once its
		// processes are gone (requeue), whenever that is (a kill that
		// failed is retried). Saved, so a restart of mpsd ends it too.
		if l.endWith == nil {
			l.endWith = &end
			d.store.request()
		}
		d.mu.Unlock()
		l.logger().Info("lease cancel requested while it is revoked: it ends instead of being requeued", l.logAttrs("by", who)...)
		writeJSON(w, api.CancelResult{Lease: q.Lease, Was: api.LeaseRevoking})
		return
	default:
		d.mu.Unlock()
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is ending already (its command ended and it is being released)", q.Lease))
		return
	}
	in := l.inst
	how := revokeHow{dm: in.daemon, servers: in.mps.pids(), force: true,
		end: &end}
	if q.Signal != 0 {
		how.signal = &revokeSignal{sig: unix.Signal(q.Signal), grace: q.Grace()}
	}
	d.mu.Unlock()
	l.logger().Info("lease cancel requested", l.logAttrs("by", who, "signal", q.Signal)...)
	if d.revoke([]*lease{l}, "cancelled by "+who, how) == 0 {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s ended or began its end meanwhile; not cancelled", q.Lease))
		return
	}
	d.awaitRecorded(r.Context(), l) // answered once the history has it
	res := api.CancelResult{Lease: q.Lease, Was: api.LeaseRunning, Killed: true}
	if how.signal != nil {
		res.Signalled, res.Killed = how.signal.signalled, how.signal.left
	}
	writeJSON(w, res)
}

// serveInjectXid raises a simulated Xid; on real GPUs there is nothing to
// inject into.
func (d *Daemon) serveInjectXid(w http.ResponseWriter, r *http.Request) {
	if !d.requireAdmin(w, r) {
		return
	}
	q, ok := readBody(w, r, d.opts.RequestTimeout, api.DecodeInjectXidRequest)
	if !ok {
		return
	}
	if d.opts.XidInjector == nil {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, "inject-xid works only on simulated GPUs (mpsd --simulate); this mpsd runs on real ones")
		return
	}
	if err := d.opts.XidInjector.InjectXid(q.GPU, q.Xid, q.PID); err != nil {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("inject Xid %d on GPU %d: %v", q.Xid, q.GPU, err))
		return
	}
	d.log.Info("simulated Xid injected by admin", "gpu_index", q.GPU, "xid", q.Xid, "pid", q.PID)
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	_, _ = w.Write([]byte("{}\n"))
}
