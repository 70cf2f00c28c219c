package mpsd

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// mpsd says which build it is on its API: GET /v1/version answers
// anyone; every answer (a status, a refusal, a path it does not know, a
// refused lease request) carries its version and API level; the status document
// names the build for an admin and for each of two users alike; the
// build_info metric has the commit.
func TestVersionOnTheAPI(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	e.start()
	want := builtVersion()
	in := buildinfo.Read()
	if want.Version != in.Version || want.APILevel != api.APILevel || want.GoVersion != in.GoVersion {
		t.Fatalf("builtVersion() = %+v; want the build's %+v at level %d", want, in, api.APILevel)
	}

	c := client.New(e.socket)
	if v, err := c.Version(t.Context()); err != nil || v != want {
		t.Errorf("GET %s as root = %+v, %v; want %+v", api.PathVersion, v, err, want)
	}
	if s, ok := c.Served(); !ok || s.Level != api.APILevel || s.Version != want.Version {
		t.Errorf("Served = %+v, %v; want level %d, version %q", s, ok, api.APILevel, want.Version)
	}
	st, _, err := c.Status(t.Context())
	if err != nil || st.Mpsd == nil || *st.Mpsd != want {
		t.Errorf("admin's status: mpsd %+v, %v; want %+v", st.Mpsd, err, want)
	}

	// Two users, each in a group of its own, see the same.
	helper := e.isoBuildAPICall()
	for _, uid := range []uint32{isoUIDA, isoUIDB} {
		for _, path := range []string{api.PathVersion, api.PathStatus} {
			r := run(t, asUID(apiCallCmd(helper, "-socket", e.socket, "-method", "GET", "-path", path), uid))
			first, body, _ := strings.Cut(r.stdout, "\n")
			if r.code != 0 || first != "ok" {
				t.Fatalf("GET %s as uid %d: exit %d, %q, stderr %q", path, uid, r.code, r.stdout, r.stderr)
			}
			var doc struct {
				api.Version
				OwnOnly bool         `json:"own_only"`
				Mpsd    *api.Version `json:"mpsd"`
			}
			if err := json.Unmarshal([]byte(body), &doc); err != nil {
				t.Fatalf("GET %s as uid %d: %v: %s", path, uid, err, body)
			}
			got := doc.Version
			if path == api.PathStatus {
				if !doc.OwnOnly || doc.Mpsd == nil {
					t.Fatalf("uid %d's status: own_only %v, mpsd %+v; want its own view with mpsd's version", uid, doc.OwnOnly, doc.Mpsd)
				}
				got = *doc.Mpsd
			}
			if got != want {
				t.Errorf("GET %s as uid %d: version %+v, want %+v", path, uid, got, want)
			}
		}
	}

	// The headers on every kind of answer, read with net/http.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.socket)
	}}}
	defer hc.CloseIdleConnections()
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
	}{
		{"status", "GET", api.PathStatus, "", 200},
		{"unknown path", "GET", "/v1/nothing", "", 404},
		{"refused request", "POST", api.PathDrain, `{"gpu":""}`, 400},
		{"refused lease request", "POST", api.PathLeases, `{"sm":10,"mem_bytes":1073741824,"group":"nosuchgroup","command":["true"]}`, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, "http://mpsd"+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
			}
			if v, l := resp.Header.Get(api.HeaderVersion), resp.Header.Get(api.HeaderAPILevel); v != want.Version || l != strconv.Itoa(api.APILevel) {
				t.Errorf("%s %s: %s %q, %s %q; want %q, %d", tc.method, tc.path, api.HeaderVersion, v, api.HeaderAPILevel, l, want.Version, api.APILevel)
			}
		})
	}

	fams := scrape(t, mln.Addr().String())
	labels := map[string]string{"version": in.Version, "commit": in.ShortCommit()}
	if v, ok := value(fams, "mpsd_build_info", labels); !ok || v != 1 {
		t.Errorf("mpsd_build_info%v = %v (found %v), want 1", labels, v, ok)
	}
}
