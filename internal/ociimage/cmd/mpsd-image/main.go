// Command mpsd-image writes mpsd's container image archive (package
// ociimage) for make package-image:
//
//	mpsd-image -out dist/mpsd-image.tar -bin bin -ldflags "$(hack/ldflags.sh)" \
//	    -base libc6.tar -status libc6.control -base libgcc-s1.tar -status libgcc-s1.control
//
// -bin is the directory of the built programs (mpsd, mpsctl, mps-launch),
// -ldflags what they were stamped with (the image's tag, revision and
// time come from it; with none, SOURCE_DATE_EPOCH or 0 is the time and
// the tag is latest), each -base a Debian package's data archive
// (dpkg-deb --fsys-tarfile; hack/fetch-image-debs.sh writes them), each
// -status a package's control paragraph (dpkg-deb -f), listed in the
// image's /var/lib/dpkg/status.d for scanners. It prints the image's
// reference and manifest digest.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/internal/ociimage"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(s string) error { *p = append(*p, s); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mpsd-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "the archive to write")
	bin := fs.String("bin", "bin", "the directory of the built programs")
	ldflags := fs.String("ldflags", "", "what hack/ldflags.sh stamped the programs with")
	arch := fs.String("arch", runtime.GOARCH, "the programs' and packages' architecture")
	var base, status paths
	fs.Var(&base, "base", "a Debian package's data archive (repeatable)")
	fs.Var(&status, "status", "a Debian package's control paragraph, for /var/lib/dpkg/status.d (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "mpsd-image: want -out and no arguments")
		return 2
	}
	ref, digest, err := build(*out, *bin, *ldflags, *arch, base, status)
	if err != nil {
		fmt.Fprintf(stderr, "mpsd-image: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s %s\n", *out, ref, digest)
	return 0
}

func build(out, bin, ldflags, arch string, base, status []string) (ref, digest string, err error) {
	stamp, err := ociimage.ParseLdflags(ldflags)
	if err != nil {
		return "", "", err
	}
	if stamp.Time.IsZero() {
		stamp.Time = time.Unix(0, 0).UTC()
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			sec, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return "", "", fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
			}
			stamp.Time = time.Unix(sec, 0).UTC()
		}
	}
	spec := ociimage.Spec{Version: stamp.Version, Revision: stamp.Commit, Created: stamp.Time, Arch: arch, Programs: map[string][]byte{}}
	for _, p := range base {
		f, err := os.Open(p)
		if err != nil {
			return "", "", err
		}
		entries, err := ociimage.ReadTar(f)
		f.Close()
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", p, err)
		}
		spec.Base = append(spec.Base, entries...)
	}
	for _, p := range status {
		control, err := os.ReadFile(p)
		if err != nil {
			return "", "", err
		}
		e, err := ociimage.StatusEntry(control)
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", p, err)
		}
		spec.Base = append(spec.Base, e)
	}
	for _, name := range ociimage.Programs {
		if spec.Programs[name], err = os.ReadFile(filepath.Join(bin, name)); err != nil {
			return "", "", err
		}
	}
	img, err := ociimage.Image(spec)
	if err != nil {
		return "", "", err
	}
	h, err := img.Digest()
	if err != nil {
		return "", "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mpsd-image-*.tar")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp.Name())
	err = ociimage.WriteArchive(tmp, img, stamp.Version, stamp.Time)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return "", "", fmt.Errorf("write %s: %w", out, err)
	}
	return ociimage.Ref(stamp.Version), h.String(), nil
}
