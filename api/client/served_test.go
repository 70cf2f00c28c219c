package client

import (
	"errors"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// TestServed: the client keeps what mpsd's latest answer said of itself,
// from a unary answer, a refusal and a lease stream alike; an mpsd that
// sends no level is api.LevelBase; a level that is not one is not
// taken.
func TestServed(t *testing.T) {
	fake := apitest.New(t, nil)
	fake.Answer("GET", api.PathStatus, apitest.Answer{Status: 200, Body: `{"instances":[],"leases":[],"queue":{}}`})
	c := New(fake.Socket)
	if s, ok := c.Served(); ok {
		t.Fatalf("Served before any answer = %+v, true", s)
	}
	for _, tc := range []struct {
		name, level, version string
		path                 string // GET; a refusal where the fake has no answer
		want                 Served
		ok                   bool
	}{
		{"mpsd from before levels", "", "", api.PathStatus, Served{Level: api.LevelBase}, true},
		{"level and version", "2", "v1.2.3", api.PathStatus, Served{Level: 2, Version: "v1.2.3"}, true},
		{"on a refusal", "3", "v1.3.0", "/v1/nothing", Served{Level: 3, Version: "v1.3.0"}, true},
		{"a version that is not one", "2", "v1 ;x", api.PathStatus, Served{Level: 2}, true},
		{"a level that is not one: the last one stays", "two", "v9", api.PathStatus, Served{Level: 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.Serves(tc.level, tc.version)
			_, _ = c.Get(t.Context(), tc.path, nil)
			if s, ok := c.Served(); s != tc.want || ok != tc.ok {
				t.Errorf("Served = %+v, %v; want %+v, %v", s, ok, tc.want, tc.ok)
			}
		})
	}

	fake.Serves("4", "v1.4.0")
	st, err := c.Lease(t.Context(), api.LeaseRequest{SM: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if s, _ := c.Served(); s.Level != 4 || s.Version != "v1.4.0" {
		t.Errorf("Served after a lease stream's answer = %+v", s)
	}
	lc := fake.NextLease(t)
	lc.End()
}

func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer *apitest.Answer // nil: none, the fake's 404
		want   api.Version
		check  func(error) bool
	}{
		{"answer", &apitest.Answer{Status: 200, Body: `{"version":"v1.2.3","commit":"0123abcd","api_level":2,"go_version":"go1.26.0"}`},
			api.Version{Version: "v1.2.3", Commit: "0123abcd", APILevel: 2, GoVersion: "go1.26.0"}, func(err error) bool { return err == nil }},
		{"mpsd from before levels", nil, api.Version{}, func(err error) bool {
			var ae *api.Error
			return errors.As(err, &ae) && ae.Code == api.CodeNotFound
		}},
		{"not a version", &apitest.Answer{Status: 200, Body: `{"version":"","api_level":2}`}, api.Version{},
			func(err error) bool {
				return errors.Is(err, ErrBadAnswer) && strings.Contains(err.Error(), api.PathVersion)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := apitest.New(t, nil)
			if tc.answer != nil {
				fake.Answer("GET", api.PathVersion, *tc.answer)
			}
			v, err := New(fake.Socket).Version(t.Context())
			if v != tc.want || !tc.check(err) {
				t.Errorf("Version = %+v, %v; want %+v", v, err, tc.want)
			}
		})
	}
}

func TestSkewWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		need int
		s    Served
		want string // "" for no warning
	}{
		{"same level", 2, Served{Level: 2, Version: "v1.2.3"}, ""},
		{"newer mpsd", 2, Served{Level: 5, Version: "v2.0.0"}, ""},
		{"base need, mpsd from before levels", api.LevelBase, Served{Level: api.LevelBase}, ""},
		{"older mpsd", 3, Served{Level: 2, Version: "v1.2.3"},
			"warning: mpsd v1.2.3 serves API level 2, but mpsctl v1.3.0 needs level 3 for this: upgrade mpsd, or use the mpsctl of mpsd's release"},
		{"mpsd from before levels", 2, Served{Level: api.LevelBase},
			"warning: mpsd (a version from before API levels) serves API level 1, but mpsctl v1.3.0 needs level 2 for this: upgrade mpsd, or use the mpsctl of mpsd's release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SkewWarning("mpsctl", "v1.3.0", tc.need, tc.s); got != tc.want {
				t.Errorf("SkewWarning = %q, want %q", got, tc.want)
			}
		})
	}
}
