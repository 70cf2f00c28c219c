package mpsctl

import (
	"bytes"
	"context"
	"flag"
	"fmt"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// versionCommand is `mpsctl version`: mpsctl's --version line, then
// mpsd's (GET api.PathVersion). mpsctl's line comes first and whatever
// mpsd does, so that an unreachable mpsd still leaves it on stdout.
func versionCommand(*flag.FlagSet) runFunc {
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		if _, err := fmt.Fprintln(inv.stdout, buildinfo.Read().Line("mpsctl")); err != nil {
			return err
		}
		v, err := inv.client().Version(ctx)
		if err != nil {
			return fmt.Errorf("mpsd's version: %w", err)
		}
		_, err = fmt.Fprintln(inv.stdout, MpsdVersionLine(v))
		return err
	}
}

// MpsdVersionLine is mpsd's version as mpsctl version prints it, in the
// shape of the --version lines: "mpsd v1.2.3 commit 0123456789ab
// go1.26.0, API level 2".
func MpsdVersionLine(v api.Version) string {
	in := buildinfo.Info{Version: v.Version, Commit: v.Commit, Modified: v.Modified}
	gov := ""
	if v.GoVersion != "" {
		gov = " " + cell(v.GoVersion)
	}
	return fmt.Sprintf("mpsd %s commit %s%s, API level %d", cell(v.Version), cell(in.ShortCommit()), gov, v.APILevel)
}

// writeMpsdVersion is status's line under the instances that names the
// mpsd that answered (Status.Mpsd; nothing from an mpsd that does not
// say).
func writeMpsdVersion(b *bytes.Buffer, st api.Status) {
	if st.Mpsd != nil {
		fmt.Fprintf(b, "  %s\n", MpsdVersionLine(*st.Mpsd))
	}
}
