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
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/mpsd/mpsd/internal/debpkg"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:]))
}

func run(_ context.Context, args []string) int {
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
	if err := build(*version, *debVersion, *commitTime, *bin, *root, *out, *goarch); err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		return 1
	}
	return 0
}

func build(version, debVersion, commitTime, bin, root, out, goarch string) error {
	var ct time.Time
	if commitTime != "" {
		t, err := time.Parse(time.RFC3339, commitTime)
		if err != nil {
			return fmt.Errorf("-commit-time: %w", err)
		}
		ct = t
	}
	mtime := ct
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", e, err)
		}
		mtime = time.Unix(n, 0)
	}
	if mtime.IsZero() {
		return fmt.Errorf("no time for the files: give -commit-time or SOURCE_DATE_EPOCH")
	}
	if debVersion == "" {
		v, err := debpkg.DebVersion(version, ct)
		if err != nil {
			return err
		}
		debVersion = v
	}
	arch, err := debpkg.DebArch(goarch)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "mkdeb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(out, debpkg.FileName(debVersion, arch))
	tmp, err := os.CreateTemp(out, ".mkdeb-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	spec := debpkg.Spec{Root: root, Bin: bin, Version: debVersion, Arch: arch, MTime: mtime.UTC(), Work: work}
	if err := debpkg.Build(spec, tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	fmt.Println(dst)
	return nil
}
