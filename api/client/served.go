package client

import (
	"fmt"
	"sync/atomic"

	"github.com/mpsd/mpsd/api"
)

// Served is what mpsd said of itself on an answer (api.HeaderAPILevel,
// api.HeaderVersion): the API level it serves, api.LevelBase from an mpsd
// from before the header, and its version, "" when it sent none.
type Served struct {
	Level   int
	Version string
}

// served holds the Served of a client's latest answer; copies of a Client
// share it.
type served struct{ p atomic.Pointer[Served] }

// record keeps what resp says of mpsd; an answer whose level is not one
// (a proxy's, a broken mpsd's) is not taken for mpsd's word.
func (s *served) record(resp *response) {
	level, err := api.ParseAPILevel(resp.apiLevel)
	if err != nil {
		return
	}
	v := resp.version
	if api.ValidVersionText(v) != nil {
		v = ""
	}
	s.p.Store(&Served{Level: level, Version: v})
}

// Served returns what mpsd's latest answer to this client (to any request,
// the lease stream's included) said of itself, and false before mpsd
// has answered.
func (c *Client) Served() (Served, bool) {
	if c.served == nil {
		return Served{}, false
	}
	s := c.served.p.Load()
	if s == nil {
		return Served{}, false
	}
	return *s, true
}

// SkewWarning is the one line a client tool (named tool, of version
// toolVersion) prints when it needs API level need of an mpsd that serves
// s, a lower one: mpsd cannot serve what the tool is about to use. It is
// "" when s serves need: a later mpsd serves every earlier level, so an
// mpsd newer than the tool never warrants it.
func SkewWarning(tool, toolVersion string, need int, s Served) string {
	if s.Level >= need {
		return ""
	}
	mpsd := "mpsd " + s.Version
	if s.Version == "" {
		mpsd = "mpsd (a version from before API levels)"
	}
	return fmt.Sprintf("warning: %s serves API level %d, but %s %s needs level %d for this: upgrade mpsd, or use the %s of mpsd's release",
		mpsd, s.Level, tool, toolVersion, need, tool)
}
