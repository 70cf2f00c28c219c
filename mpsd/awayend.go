package mpsd

import (
	"net/http"
	"time"

	"github.com/mpsd/mpsd/api"
)

// maxAwayEnds bounds the ends kept for launchers that were away.
const maxAwayEnds = 1024

// awayEnd is how a lease ended while its launcher was away (mpsd had
// restarted and finished the lease's revocation before the launcher
// resumed it: a cancel or a shutdown that mpsd stopped in the middle of,
// or a revocation that used up its attempts), kept for that launcher's
// resume for the reconnect grace, so that it learns the end (a cancel's
// exit status 122) rather than that mpsd does not know the lease.
type awayEnd struct {
	uid   uint32
	err   api.Error
	until time.Time
}

// noteAwayEndLocked keeps l's end for its launcher if none holds the
// lease now. Entries past their grace go at each note; at maxAwayEnds a
// new one is not kept (its launcher then hears that the lease is not
// known). d.mu is held.
func (d *Daemon) noteAwayEndLocked(l *lease, code api.ErrorCode, msg string) {
	if l.bound {
		return
	}
	now := d.clock.Now()
	for id, e := range d.awayEnds {
		if !now.Before(e.until) {
			delete(d.awayEnds, id)
		}
	}
	if len(d.awayEnds) >= maxAwayEnds {
		return
	}
	if d.awayEnds == nil {
		d.awayEnds = map[string]awayEnd{}
	}
	d.awayEnds[l.id] = awayEnd{uid: l.uid, err: api.Error{Code: code, Message: msg}, until: now.Add(d.opts.ReconnectGrace)}
}

// takeAwayEndLocked is the refusal that tells the launcher of uid
// resuming lease id how the lease ended while it was away; nil when mpsd
// keeps no such end. d.mu is held.
func (d *Daemon) takeAwayEndLocked(id string, uid uint32) *refusal {
	e, ok := d.awayEnds[id]
	if !ok || e.uid != uid || !d.clock.Now().Before(e.until) {
		return nil
	}
	delete(d.awayEnds, id)
	return &refusal{http.StatusGone, e.err.Code, e.err.Message}
}
