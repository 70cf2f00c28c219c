// Command mkdeb builds mpsd's Debian package (package debpkg) from make
// build's programs: make package-deb runs
//
//	mkdeb -version VERSION -commit-time TIME -bin bin -root . -out dist
//
// with the version and commit time hack/ldflags.sh stamps, and prints the
// package's path. SOURCE_DATE_EPOCH, when set, is the files' time instead
// of the commit's.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/mpsd/mpsd/internal/debpkg"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("mkdeb", flag.ContinueOnError)
	version := fs.String("version", "", "the stamped version (git describe --tags --always --dirty)")
	debVersion := fs.String("deb-version", "", "the Debian version, instead of the one -version maps to")
	commitTime := fs.String("commit-time", "", "the commit's time (RFC 3339): the files' time, and a bare commit's version")
	bin := fs.String("bin", "bin", "the directory of the built mpsd, mpsctl and mps-launch")
	root := fs.String("root", ".", "the repository's root")
	out := fs.String("out", "dist", "the directory the package is written to")
	goarch := fs.String("goarch", runtime.GOARCH, "the programs' GOARCH")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var ct time.Time
	if *commitTime != "" {
		t, err := time.Parse(time.RFC3339, *commitTime)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mkdeb: -commit-time:", err)
			return 2
		}
		ct = t
	}
	path, err := build(*version, *debVersion, ct, *bin, *root, *out, *goarch)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		return 1
	}
	fmt.Println(path)
	return 0
}

func build(version, debVersion string, commitTime time.Time, bin, root, out, goarch string) (string, error) {
	mtime, err := debpkg.MTime(commitTime, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return "", err
	}
	if debVersion == "" {
		if debVersion, err = debpkg.DebVersion(version, commitTime); err != nil {
			return "", err
		}
	}
	arch, err := debpkg.DebArch(goarch)
	if err != nil {
		return "", err
	}
	return debpkg.WriteDist(debpkg.Spec{Root: root, Bin: bin, Version: debVersion, Arch: arch, MTime: mtime}, out)
}
