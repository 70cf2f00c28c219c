package launcher

import (
	"fmt"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// requestLevel is the API level of the newest thing a session with req
// uses (api/version.go): the lease request and its fields, the lease
// stream's events, attach and release are all api.LevelBase (the hints
// an older mpsd refuses, attach_pid, will_attach and attempt, and the
// release's exit_status and signal of api.LevelOperatorView, are asked
// again without, so the session needs none of them). A field or request
// added at a later level that it cannot do without raises it here when req
// uses it.
func requestLevel(api.LeaseRequest) int { return api.LevelBase }

// warnSkew prints, once in the session, the line that says mpsd serves a
// lower API level than the session needs (client.SkewWarning): after
// each answer that opened a lease stream, since a restarted mpsd may be
// another build. The status line, if shown, is cleared first.
func (s *session) warnSkew() {
	if s.skewWarned {
		return
	}
	served, ok := s.client.Served()
	if !ok {
		return
	}
	need := s.cfg.apiLevel
	if need == 0 {
		need = requestLevel(s.req)
	}
	w := client.SkewWarning("mps-launch", buildinfo.Read().Version, need, served)
	if w == "" {
		return
	}
	s.skewWarned = true
	s.status.clear()
	fmt.Fprintf(s.errw, "%s%s\n", s.prefix(), w)
}
