package mpsctl

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// TestVersionCommand: mpsctl version prints mpsctl's line and mpsd's;
// mpsctl's line is there whatever mpsd does; an mpsd from before
// /v1/version gets the skew warning, once, and the command fails; a
// newer mpsd gets none.
func TestVersionCommand(t *testing.T) {
	own := buildinfo.Read().Line("mpsctl") + "\n"
	answer := `{"version":"v1.2.3","commit":"0123456789abcdef","api_level":2,"go_version":"go1.26.0","later_field":1}`
	for _, tc := range []struct {
		name string
		// level and version the fake's headers say (level "": none);
		// body its answer to GET /v1/version ("": none, 404).
		level, version, body string
		unreachable          bool
		code                 int
		stdout               string
		stderr               []string // substrings, one per line, in order
	}{
		{name: "same level", level: "2", version: "v1.2.3", body: answer, code: ExitOK,
			stdout: own + "mpsd v1.2.3 commit 0123456789ab go1.26.0, API level 2\n"},
		{name: "newer mpsd", level: "5", version: "v2.0.0",
			body: `{"version":"v2.0.0","commit":"abcdef","modified":true,"api_level":5}`, code: ExitOK,
			stdout: own + "mpsd v2.0.0 commit abcdef+dirty, API level 5\n"},
		{name: "mpsd from before levels", code: ExitFailure, stdout: own,
			stderr: []string{
				"mpsctl: warning: mpsd (a version from before API levels) serves API level 1, but mpsctl " + buildinfo.Read().Version + " needs level 2 for this: upgrade mpsd",
				"mpsctl: mpsd's version: ",
			}},
		{name: "unreachable", unreachable: true, code: ExitFailure, stdout: own,
			stderr: []string{"mpsctl: mpsd's version: cannot reach mpsd at "}},
		{name: "not a version", level: "2", version: "v1", body: `{"version":"v1"}`, code: ExitFailure, stdout: own,
			stderr: []string{"mpsctl: mpsd's version: bad answer from mpsd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := filepath.Join(t.TempDir(), "none.sock")
			if !tc.unreachable {
				replies := map[string]reply{}
				if tc.body != "" {
					replies["GET "+api.PathVersion] = reply{status: 200, body: tc.body}
				}
				fake := newFake(t, replies)
				fake.srv.Serves(tc.level, tc.version)
				socket = fake.socket
			}
			r := mpsctl(t, Config{}, nil, "--socket", socket, "version")
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.stderr == "" {
				lines = nil
			}
			if r.code != tc.code || r.stdout != tc.stdout || len(lines) != len(tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, %q, %d lines", r.code, r.stdout, r.stderr, tc.code, tc.stdout, len(tc.stderr))
			}
			for i, want := range tc.stderr {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("stderr line %d = %q, want it to start %q", i+1, lines[i], want)
				}
			}
		})
	}
}

// TestSkewWarningByWhatIsUsed: mpsctl warns, once, when mpsd serves a
// lower level than what the command uses (cancel; drain with --reason),
// and says nothing where mpsd serves it (status and a drain without a
// reason of any mpsd; anything of an mpsd at this level).
func TestSkewWarningByWhatIsUsed(t *testing.T) {
	drained := ok(t, api.AdminResult{})
	for _, tc := range []struct {
		name  string
		level string // the fake's api.HeaderAPILevel ("": none, an mpsd from before levels)
		args  []string
		path  string // POST; "" for status
		warn  bool
	}{
		{"status of an mpsd from before levels", "", []string{"status"}, "", false},
		{"status of this level", "2", []string{"status"}, "", false},
		{"drain without a reason, mpsd from before levels", "", []string{"drain", "--gpu", "0"}, api.PathDrain, false},
		{"drain with a reason, mpsd from before levels", "", []string{"drain", "--gpu", "0", "--reason", "fan"}, api.PathDrain, true},
		{"drain with a reason, this level", "2", []string{"drain", "--gpu", "0", "--reason", "fan"}, api.PathDrain, false},
		{"cancel, mpsd from before levels", "", []string{"cancel", "l-1"}, api.PathCancel, true},
		{"cancel, a later level", "7", []string{"cancel", "l-1"}, api.PathCancel, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replies := map[string]reply{"GET " + api.PathStatus: ok(t, api.Status{SchemaVersion: 1, Queue: map[string]int{}})}
			switch tc.path {
			case api.PathDrain:
				replies["POST "+tc.path] = drained
			case api.PathCancel:
				replies["POST "+tc.path] = ok(t, api.CancelResult{Lease: "l-1", Was: api.LeaseQueued})
			}
			fake := newFake(t, replies)
			fake.srv.Serves(tc.level, "v1.2.3")
			r := mpsctl(t, Config{}, nil, append([]string{"--socket", fake.socket}, tc.args...)...)
			warnings := strings.Count(r.stderr, "mpsctl: warning: ")
			if r.code != ExitOK || (warnings == 1) != tc.warn || warnings > 1 {
				t.Errorf("exit %d, stderr %q; want 0 and a warning %v, once", r.code, r.stderr, tc.warn)
			}
		})
	}
}

// TestStatusNamesMpsd: status shows the mpsd that answered on one line
// under the instances, and nothing for an mpsd that does not say, nor
// where the instances or the notes are not shown.
func TestStatusNamesMpsd(t *testing.T) {
	const line = "  mpsd v1.2.3 commit 0123456789ab go1.26.0, API level 2\n"
	st := statusFixture()
	var without bytes.Buffer
	if err := WriteStatus(&without, st, nil); err != nil {
		t.Fatal(err)
	}
	st.Mpsd = &api.Version{Version: "v1.2.3", Commit: "0123456789abcdef", APILevel: 2, GoVersion: "go1.26.0"}
	var with bytes.Buffer
	if err := WriteStatus(&with, st, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(without.String(), "API level") {
		t.Errorf("status without Status.Mpsd names an mpsd:\n%s", without.String())
	}
	got := with.String()
	i := strings.Index(got, line)
	if strings.Count(got, line) != 1 || i < strings.Index(got, "INSTANCES") || i > strings.Index(got, "\nRUNNING") {
		t.Errorf("status does not name mpsd once, under the instances (%q):\n%s", line, got)
	}
	if strings.Replace(got, line, "", 1) != without.String() {
		t.Errorf("status with Status.Mpsd differs by more than its line:\n%s\nwithout:\n%s", got, without.String())
	}
	// Rows only, or no instances shown: no line.
	for _, v := range []StatusView{{NoHeaders: true}, {Only: []string{"running"}}} {
		var b bytes.Buffer
		if err := WriteStatusView(&b, st, nil, v); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "API level") {
			t.Errorf("status %+v names mpsd:\n%s", v, b.String())
		}
	}
}
