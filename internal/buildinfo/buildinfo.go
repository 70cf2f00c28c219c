// Package buildinfo says which build of mpsd's tools is running: the
// module version, the commit it was built from and the Go toolchain, as
// the Go linker recorded them (runtime/debug.ReadBuildInfo). It backs the
// --version flag of mpsd, mps-launch and mpsctl and mpsd's build_info
// metric, so all of them agree.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info is what the binary knows of its own build.
type Info struct {
	// Version is the main module's version: a tag, a pseudo-version, or
	// "(devel)" for a build from a work tree.
	Version string
	// Commit is the VCS revision the binary was built from ("" if the
	// build did not record one, as with `go test` or -buildvcs=false);
	// Modified says the work tree had uncommitted changes.
	Commit   string
	Modified bool
	// Time is the commit's time (RFC 3339), "" if unknown.
	Time string
	// GoVersion is the toolchain that built it.
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	in := Info{Version: "(devel)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return in
	}
	return fromBuildInfo(bi)
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
// "mpsctl (devel) commit 0123456789ab (2026-12-01T14:00:00Z) go1.26.0 linux/amd64".
func (in Info) Line(tool string) string {
	when := ""
	if in.Time != "" {
		when = " (" + in.Time + ")"
	}
	return fmt.Sprintf("%s %s commit %s%s %s %s/%s", tool, in.Version, in.ShortCommit(), when, in.GoVersion, runtime.GOOS, runtime.GOARCH)
}
