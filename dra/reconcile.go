package dra

import (
	"context"
	"errors"
	"os"
	"strconv"
	"time"

	"github.com/mpsd/mpsd/api"
)

// adoptOnce takes over, on the first status read, the running leases of
// this uid whose job id names a claim (JobID): those of claims prepared
// before mpsd or the kubelet restarted, kept by mpsd. Their streams are
// resumed by regain, from the next reconcile or prepare.
func (d *Driver) adoptOnce(st api.Status) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.adopted {
		return
	}
	d.adopted = true
	uid := uint32(os.Getuid())
	for _, ls := range st.Leases {
		cu, n, ok := ParseJobID(ls.JobID)
		if !ok || ls.UID != uid || ls.State != api.LeaseRunning || len(ls.GPUIndexes) == 0 || !d.offered(ls.Group) {
			continue
		}
		c := d.claims[cu]
		if c == nil {
			c = &claim{uid: cu}
			d.claims[cu] = c
		}
		sel := make([]string, len(ls.GPUIndexes))
		for i, g := range ls.GPUIndexes {
			sel[i] = strconv.Itoa(g)
		}
		zero := 0
		l := &lease{c: c, n: n, group: ls.Group, gpu: ls.GPUIndexes[0], id: ls.ID, attempt: ls.Attempt, adopted: true,
			req: api.LeaseRequest{Group: ls.Group, SM: ls.SM, MemBytes: ls.MemBytes, GPUs: len(ls.GPUIndexes),
				GPUSelect: sel, RequeueAttempts: &zero, NoWait: true, JobID: ls.JobID}}
		c.leases = append(c.leases, l)
		d.log.Info("adopting the lease of a claim prepared before a restart", "group", ls.Group, "gpu", l.gpu, "lease", ls.ID, "job_id", ls.JobID)
	}
}

// reconcile gets every lease that lost its stream back (regain), and
// rewrites the CDI spec of a claim whose leases changed.
func (d *Driver) reconcile(ctx context.Context, st api.Status) {
	if d.lock(ctx) != nil {
		return
	}
	defer d.unlock()
	d.adoptOnce(st)
	now := d.opts.Clock.Now()
	d.mu.Lock()
	var work []*lease
	for _, c := range d.claims {
		for _, l := range c.leases {
			if l.stream == nil && !l.ended && !now.Before(l.retryAt) {
				work = append(work, l)
			}
		}
	}
	d.mu.Unlock()
	for _, l := range work {
		before := l.grantedID()
		err := d.regain(ctx, st, l)
		if err == nil {
			if l.grantedID() != before {
				if err := d.writeSpec(l.c); err != nil {
					d.log.With(d.claimAttrs(l.c)...).Warn("cannot rewrite the claim's CDI spec", "err", err)
				}
			}
			continue
		}
		d.mu.Lock()
		l.retries++
		l.retryAt = now.Add(min(time.Second<<min(l.retries, 6), maxRetry))
		retries := l.retries
		d.mu.Unlock()
		if retries == 1 {
			d.log.With(d.claimAttrs(l.c)...).Warn("cannot get the lease of a prepared claim back; retrying", "group", l.group, "gpu", l.gpu, "err", err)
		}
	}
}

func (l *lease) grantedID() string {
	if l.granted == nil {
		return ""
	}
	return l.granted.ID
}

// regain gets l a stream again: it resumes the lease mpsd still has
// (mpsd restarted), or asks for a new one once its instance is ready
// (mpsd ended it). Called with ops held.
func (d *Driver) regain(ctx context.Context, st api.Status, l *lease) error {
	in, err := instanceOf(st, DeviceName(l.group, l.gpu))
	if err != nil {
		return err
	}
	d.mu.Lock()
	id, attempt := l.id, l.attempt
	d.mu.Unlock()
	if id != "" {
		err := d.open(ctx, l, in, api.LeaseRequest{Group: l.group, ResumeLeaseID: id, Attempt: attempt, JobID: l.req.JobID})
		if err == nil {
			d.log.With(d.claimAttrs(l.c)...).Info("lease resumed", "lease", id)
			return nil
		}
		var ae *api.Error
		if errors.As(err, &ae) && (ae.Code == api.CodeNotFound || ae.Code == api.CodeConflict || ae.Code == api.CodeForbidden) ||
			errors.Is(err, ErrRefused) {
			d.mu.Lock()
			l.id = "" // mpsd lost it: ask anew
			d.mu.Unlock()
		}
		return err
	}
	if _, down := unavailable(in); down {
		return errors.New("dra: the instance is not ready")
	}
	if err := d.open(ctx, l, in, l.req); err != nil {
		return err
	}
	d.log.With(d.claimAttrs(l.c)...).Info("lease renewed for a prepared claim", "lease", l.grantedID())
	return nil
}
