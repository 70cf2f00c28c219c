package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"release", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T14:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			"mpsctl v1.2.3 commit 0123456789ab (2026-12-01T14:00:00Z) go1.26.0 "},
		{"work tree with changes", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abcdef"}, {Key: "vcs.modified", Value: "true"}}},
			"mpsctl (devel) commit abcdef+dirty go1.26.0 "},
		{"nothing recorded", debug.BuildInfo{}, "mpsctl (devel) commit unknown " + runtime.Version() + " "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fromBuildInfo(&tc.bi).Line("mpsctl")
			if !strings.HasPrefix(got, tc.want) || !strings.HasSuffix(got, runtime.GOOS+"/"+runtime.GOARCH) {
				t.Errorf("Line = %q, want %q + GOOS/GOARCH", got, tc.want)
			}
		})
	}
}

func TestRead(t *testing.T) {
	in := Read()
	if in.Version == "" || !strings.HasPrefix(in.GoVersion, "go") {
		t.Errorf("Read() = %+v: want a version and the Go version", in)
	}
}

// TestStamped: make build's values win over the linker's; a version
// git describe ended with -dirty marks the build modified.
func TestStamped(t *testing.T) {
	linker := Info{Version: "(devel)", Commit: "ffffffffffffffff", Time: "2026-01-01T00:00:00Z", GoVersion: "go1.26.0"}
	for _, tc := range []struct {
		name                  string
		version, commit, when string
		want                  string
	}{
		{"nothing stamped", "", "", "", "mpsctl (devel) commit ffffffffffff (2026-01-01T00:00:00Z) go1.26.0 "},
		{"tag", "v1.2.3", "0123456789abcdef", "2026-12-01T14:00:00Z", "mpsctl v1.2.3 commit 0123456789ab (2026-12-01T14:00:00Z) go1.26.0 "},
		{"work tree with changes", "v1.2.3-4-g0123456-dirty", "0123456789abcdef", "", "mpsctl v1.2.3-4-g0123456-dirty commit 0123456789ab+dirty go1.26.0 "},
		{"tarball without a commit", "v1.2.3", "", "", "mpsctl v1.2.3 commit ffffffffffff (2026-01-01T00:00:00Z) go1.26.0 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := linker.stamped(tc.version, tc.commit, tc.when).Line("mpsctl")
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("Line = %q, want %q + GOOS/GOARCH", got, tc.want)
			}
		})
	}
}
