// Command mkchart packages mpsd's Helm chart (package helmchart) for make
// package-chart:
//
//	mkchart -chart deploy/helm/mpsd -ldflags "$(hack/ldflags.sh)" -out dist
//
// -ldflags is what make build stamped the programs with: the chart's
// version is derived from its version, its appVersion (the default
// image tag) is the tag make package-image gives the image, and its
// files are dated the commit's time. It prints the archive's path.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/mpsd/mpsd/internal/helmchart"
	"github.com/mpsd/mpsd/internal/ociimage"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkchart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("chart", "deploy/helm/mpsd", "the chart's directory")
	ldflags := fs.String("ldflags", "", "what hack/ldflags.sh stamped the programs with")
	out := fs.String("out", "", "the directory to write <name>-<version>.tgz into")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "mkchart: want -out and no arguments")
		return 2
	}
	stamp, err := ociimage.ParseLdflags(*ldflags)
	if err == nil && stamp.Version == "" {
		err = fmt.Errorf("no version in -ldflags %q (hack/ldflags.sh prints none without git or a VERSION file)", *ldflags)
	}
	var p string
	if err == nil {
		p, err = helmchart.Package(*dir, *out, stamp)
	}
	if err != nil {
		fmt.Fprintf(stderr, "mkchart: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, p)
	return 0
}
