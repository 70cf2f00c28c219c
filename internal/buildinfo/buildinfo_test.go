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
