package mpsd

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// builtVersion is this mpsd's build as the API reports it (GET
// api.PathVersion, Status.Mpsd, the version headers): what --version
// says, cut to what api.Version allows (a commit that is not lower-case
// hex is left out, a version that is not printable becomes "(invalid)").
var builtVersion = sync.OnceValue(func() api.Version {
	in := buildinfo.Read()
	v := api.Version{Version: in.Version, Commit: strings.ToLower(in.Commit), Modified: in.Modified,
		APILevel: api.APILevel, GoVersion: in.GoVersion}
	if api.ValidVersionText(v.Version) != nil || v.Version == "" {
		v.Version = "(invalid)"
	}
	if api.ValidVersionText(v.GoVersion) != nil {
		v.GoVersion = ""
	}
	if v.Validate() != nil {
		v.Commit = ""
	}
	return v
})

// apiLevelText is api.APILevel as api.HeaderAPILevel carries it.
var apiLevelText = strconv.Itoa(api.APILevel)

// setVersionHeaders puts mpsd's version and API level on an answer, so
// that every answer (a refusal, a lease stream, a 503 while mpsd stops)
// says which mpsd gave it: a client checks that the level serves what
// it uses (api.LevelBase and up).
func setVersionHeaders(h http.Header) {
	h.Set(api.HeaderVersion, builtVersion().Version)
	h.Set(api.HeaderAPILevel, apiLevelText)
}

// serveVersion answers GET api.PathVersion: anyone may ask.
func (d *Daemon) serveVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, builtVersion())
}
