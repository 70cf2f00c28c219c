// Package buildinfo says which build of mpsd's tools is running: its
// version, the commit it was built from and the Go toolchain. It backs the
// --version flag of mpsd, mps-launch and mpsctl, mpsd's build_info metric
// and the version mpsd reports on its API, so all of them agree.
//
// Where it learns them: `make build` stamps the version (git describe, or
// a release tarball's VERSION file) and the commit into the binaries with
// -ldflags -X (hack/ldflags.sh); a binary built otherwise has what the Go linker
// recorded (runtime/debug.ReadBuildInfo: the module version and, where the
// go command could read the repository, the VCS revision). Stamped values
// win. It never runs programs or reads files.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the linker (make build, through hack/ldflags.sh): go build
// -ldflags "-X github.com/mpsd/mpsd/internal/buildinfo.version=v1.2.3 -X
// ...". Empty when the build did not stamp them.
var (
	// version is `git describe --tags --always --dirty`, or the first
	// field of a release tarball's VERSION file.
	version string
	// commit is the full commit hash, "" when unknown.
	commit string
	// commitTime is the commit's time (RFC 3339), "" when unknown.
	commitTime string
)

// Info is what the binary knows of its own build.
type Info struct {
	// Version is the stamped version (a tag, "v1.2.3-4-gabcdef0", a bare
	// abbreviated commit in a repository without tags, with "-dirty" for
	// a work tree with changes), else the main module's version: a tag, a
	// pseudo-version, or "(devel)" for a build from a work tree.
	Version string
	// Commit is the VCS revision the binary was built from ("" if the
	// build recorded none, as with `go test` or -buildvcs=false outside
	// make build); Modified says the work tree had uncommitted changes.
	Commit   string
	Modified bool
	// Time is the commit's time (RFC 3339), "" if unknown.
	Time string
	// GoVersion is the toolchain that built it.
	GoVersion string
}

// Read returns the running binary's build information: the stamped
// version and commit where make build set them, else what the Go linker
// recorded.
func Read() Info {
	in := Info{Version: "(devel)", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		in = fromBuildInfo(bi)
	}
	return in.stamped(version, commit, commitTime)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	if in.GoVersion == "" {
		in.GoVersion = runtime.Version()
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		case "vcs.time":
			in.Time = s.Value
		}
	}
	return in
}

// stamped is in with the values make build stamped in place of the
// linker's: a stamped version replaces the module's, and says whether the
// work tree was modified ("-dirty", as git describe --dirty ends it); a
// stamped commit replaces the recorded one, with its time (the recorded
// time is another commit's, or the same one's).
func (in Info) stamped(version, commit, commitTime string) Info {
	if version != "" {
		in.Version = version
		in.Modified = strings.HasSuffix(version, "-dirty")
	}
	if commit != "" {
		in.Commit, in.Time = commit, commitTime
	}
	return in
}

// ShortCommit is the commit's first 12 hex digits, with "+dirty" when the
// work tree was modified, or "unknown".
func (in Info) ShortCommit() string {
	c := in.Commit
	if c == "" {
		return "unknown"
	}
	if len(c) > 12 {
		c = c[:12]
	}
	if in.Modified {
		c += "+dirty"
	}
	return c
}

// Line is the one line `TOOL --version` prints:
// "mpsctl v1.2.3 commit 0123456789ab (2026-12-01T14:00:00Z) go1.26.0 linux/amd64".
func (in Info) Line(tool string) string {
	when := ""
	if in.Time != "" {
		when = " (" + in.Time + ")"
	}
	return fmt.Sprintf("%s %s commit %s%s %s %s/%s", tool, in.Version, in.ShortCommit(), when, in.GoVersion, runtime.GOOS, runtime.GOARCH)
}
