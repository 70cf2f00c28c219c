package debpkg

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// Name is the package's name.
const Name = "mpsd"

// The package's control fields besides its name and version. Depends
// names what the maintainer scripts need on every host (deb-systemd-helper
// and deb-systemd-invoke come with init-system-helpers); the programs'
// libc6, at the version they were linked against, is added to it from the
// programs themselves (LibcDepends). Recommends what a
// host under systemd with rotated MPS logs has; Suggests the NVIDIA
// driver's MPS programs, which mpsd runs but which come with the driver:
// Debian packages them as nvidia-cuda-mps, NVIDIA's own repositories and
// installers otherwise, so a Recommends could make apt pull Debian's
// driver over NVIDIA's.
var (
	Depends    = []string{"init-system-helpers (>= 1.54~)"}
	Recommends = []string{"systemd", "logrotate"}
	Suggests   = []string{"nvidia-cuda-mps", "bash-completion"}
)

// Programs are the programs the package installs in /usr/bin, from the
// build's bin directory.
var Programs = []string{"mpsd", "mpsctl", "mps-launch"}

// Installed paths (docs/install.md's "Install the package" lists them).
const (
	BinDir        = "/usr/bin"
	UnitDir       = "/lib/systemd/system"
	ConfigFile    = "/etc/mpsd/mpsd.yaml"
	LogrotateFile = "/etc/logrotate.d/mpsd"
	DocDir        = "/usr/share/doc/mpsd"
	ManDir        = "/usr/share/man"
	BashCompDir   = "/usr/share/bash-completion/completions"
	ZshCompDir    = "/usr/share/zsh/vendor-completions"
)

// Spec is what one build packages.
type Spec struct {
	// Root is the repository's root: units, config, docs, examples and
	// the maintainer scripts are read below it.
	Root string
	// Bin holds the built programs (make build's bin/).
	Bin string
	// Version is the Debian version (DebVersion of the stamped one).
	Version string
	// Arch is the Debian architecture (DebArch of GOARCH).
	Arch string
	// MTime is every file's and archive member's modification time.
	MTime time.Time
	// Work is a directory for the gzipped man pages (the caller's to
	// remove).
	Work string
}

// FileName is the package's file name, as Debian names it.
func FileName(version, arch string) string {
	return fmt.Sprintf("%s_%s_%s.deb", Name, version, arch)
}

// describeRe splits `git describe --tags --always --dirty --abbrev=12`:
// a tag with an optional -N-gHASH suffix, or a bare abbreviated commit;
// either with -dirty. A hash shorter than abbrevLen is refused, as one
// that git's default abbreviation (which varies with the clone) gave.
var (
	describeRe = regexp.MustCompile(`^(.+?)(?:-([0-9]+)-g([0-9a-f]{4,40}))?(-dirty)?$`)
	hashRe     = regexp.MustCompile(`^[0-9a-f]{4,40}$`)
	// abbrevLen is hack/ldflags.sh's --abbrev.
	abbrevLen = 12
	// debUpstreamRe is what a Debian upstream version without a
	// revision may hold: it starts with a digit.
	debUpstreamRe = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)
)

// ErrVersion: the stamped version cannot be made a Debian version.
var ErrVersion = errors.New("debpkg: no Debian version for the stamped version")

// DebVersion maps the version make build stamps (hack/ldflags.sh: git
// describe) to a Debian version that sorts the way the builds do:
//
//	v1.2.0                 1.2.0
//	v1.2.0-12-gabc1234abc12     1.2.0+12.gabc1234abc12   (after 1.2.0, before 1.2.1)
//	v1.2.0-rc.1                 1.2.0~rc.1               (before 1.2.0)
//	v1.2.0-dirty                1.2.0+dirty
//	abc1234abc12 (no tag yet)   0~git20261208.143000.gabc1234abc12  (commit time: later commits sort later, every tag after)
//
// commitTime is the commit's time, used only for a bare commit. The
// result is an upstream version without a Debian revision. A commit
// abbreviated to fewer than 12 hex digits is an ErrVersion: the same
// commit would give another version elsewhere.
func DebVersion(stamped string, commitTime time.Time) (string, error) {
	m := describeRe.FindStringSubmatch(stamped)
	if m == nil {
		return "", fmt.Errorf("%w: %q", ErrVersion, stamped)
	}
	tag, count, hash, dirty := m[1], m[2], m[3], m[4] != ""
	if count == "" && hashRe.MatchString(tag) && !strings.HasPrefix(tag, "v") {
		hash = tag
	}
	if hash != "" && len(hash) < abbrevLen {
		return "", fmt.Errorf("%w: %q abbreviates the commit to fewer than %d hex digits (hack/ldflags.sh: git describe --abbrev=%d)", ErrVersion, stamped, abbrevLen, abbrevLen)
	}
	var v string
	var extra []string
	switch {
	case count == "" && hashRe.MatchString(tag) && !strings.HasPrefix(tag, "v"):
		if commitTime.IsZero() {
			return "", fmt.Errorf("%w: %q is a bare commit and its time is unknown", ErrVersion, stamped)
		}
		v = "0~git" + commitTime.UTC().Format("20060102.150405") + ".g" + tag
	default:
		t := strings.TrimPrefix(tag, "v")
		rel, pre, hasPre := strings.Cut(t, "-")
		v = rel
		if hasPre {
			v += "~" + strings.ReplaceAll(pre, "-", ".")
		}
		if count != "" {
			extra = append(extra, count, "g"+hash)
		}
	}
	if dirty {
		extra = append(extra, "dirty")
	}
	if len(extra) > 0 {
		v += "+" + strings.Join(extra, ".")
	}
	if !debUpstreamRe.MatchString(v) {
		return "", fmt.Errorf("%w: %q gives %q, which does not start with a digit or holds characters Debian refuses", ErrVersion, stamped, v)
	}
	return v, nil
}

// DebArch is Debian's name of a Go architecture.
func DebArch(goarch string) (string, error) {
	a, ok := map[string]string{
		"amd64": "amd64", "arm64": "arm64", "386": "i386", "arm": "armhf",
		"ppc64le": "ppc64el", "riscv64": "riscv64", "s390x": "s390x", "loong64": "loong64",
	}[goarch]
	if !ok {
		return "", fmt.Errorf("debpkg: no Debian architecture for GOARCH %s", goarch)
	}
	return a, nil
}

// entry is one file of the package: where it comes from (below the
// repository root, or absolute) and where it goes.
type entry struct {
	src, dst, typ string
	mode          os.FileMode
}

// Contents lists what the package installs, sorted by destination. It
// fails when a file it names is missing: a package without one of them
// is not built.
func (s Spec) Contents() (files.Contents, error) {
	var es []entry
	for _, p := range Programs {
		es = append(es, entry{src: filepath.Join(s.Bin, p), dst: path.Join(BinDir, p), mode: 0o755})
	}
	for _, u := range []string{"mpsd.service", "mpsd.socket"} {
		es = append(es, entry{src: s.path("examples/systemd/" + u), dst: path.Join(UnitDir, u), mode: 0o644})
	}
	es = append(es,
		entry{src: s.path("deploy/deb/mpsd.yaml"), dst: ConfigFile, typ: files.TypeConfigNoReplace, mode: 0o644},
		entry{src: s.path("examples/logrotate/mpsd"), dst: LogrotateFile, typ: files.TypeConfigNoReplace, mode: 0o644},
	)
	for _, g := range []struct{ glob, dst string }{
		{"docs/completion/bash/*", BashCompDir},
		{"docs/completion/zsh/_*", ZshCompDir},
		{"docs/*.md", DocDir},
		{"examples/mpsd.yaml", DocDir + "/examples"},
		{"examples/logrotate/*", DocDir + "/examples/logrotate"},
		{"examples/prometheus/*", DocDir + "/examples/prometheus"},
		{"examples/grafana/*", DocDir + "/examples/grafana"},
		{"examples/kubernetes/*.yaml", DocDir + "/examples/kubernetes"},
		{"examples/slurm/*", DocDir + "/examples/slurm"},
	} {
		got, err := s.glob(g.glob)
		if err != nil {
			return nil, err
		}
		for _, src := range got {
			es = append(es, entry{src: src, dst: path.Join(g.dst, filepath.Base(src)), mode: 0o644})
		}
	}
	man, err := s.manPages()
	if err != nil {
		return nil, err
	}
	es = append(es, man...)

	var cs files.Contents
	for _, e := range es {
		fi, err := os.Stat(e.src)
		if err != nil {
			return nil, fmt.Errorf("debpkg: %s for %s: %w", e.src, e.dst, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("debpkg: %s for %s is not a regular file", e.src, e.dst)
		}
		cs = append(cs, &files.Content{Source: e.src, Destination: e.dst, Type: cmp.Or(e.typ, files.TypeFile),
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: e.mode, MTime: s.MTime}})
	}
	cs = append(cs, &files.Content{Destination: "/etc/mpsd", Type: files.TypeDir,
		FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: 0o755, MTime: s.MTime}})
	slices.SortFunc(cs, func(a, b *files.Content) int { return strings.Compare(a.Destination, b.Destination) })
	return cs, nil
}

func (s Spec) path(rel string) string { return filepath.Join(s.Root, filepath.FromSlash(rel)) }

// glob returns the regular files matching pattern below the root, Go
// tests left out; a pattern that matches nothing is an error.
func (s Spec) glob(pattern string) ([]string, error) {
	ms, err := filepath.Glob(s.path(pattern))
	if err != nil {
		return nil, fmt.Errorf("debpkg: glob %s: %w", pattern, err)
	}
	var out []string
	for _, m := range ms {
		if fi, err := os.Stat(m); err != nil || !fi.Mode().IsRegular() || strings.HasSuffix(m, ".go") {
			continue
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("debpkg: nothing matches %s below %s", pattern, s.Root)
	}
	slices.Sort(out)
	return out, nil
}

// manPages gzips docs/man's pages into the work directory as gzip -n
// does (no name, no time): /usr/share/man/manN/PAGE.N.gz.
func (s Spec) manPages() ([]entry, error) {
	pages, err := s.glob("docs/man/*.[0-9]")
	if err != nil {
		return nil, err
	}
	var es []entry
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("debpkg: read man page: %w", err)
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if _, err := zw.Write(b); err != nil {
			return nil, fmt.Errorf("debpkg: gzip %s: %w", p, err)
		}
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("debpkg: gzip %s: %w", p, err)
		}
		name := filepath.Base(p)
		gz := filepath.Join(s.Work, name+".gz")
		if err := os.WriteFile(gz, buf.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("debpkg: write man page: %w", err)
		}
		section := name[strings.LastIndexByte(name, '.')+1:]
		es = append(es, entry{src: gz, dst: path.Join(ManDir, "man"+section, name+".gz"), mode: 0o644})
	}
	return es, nil
}

// glibcRe is a glibc symbol version: GLIBC_2.34, GLIBC_2.3.2 (not
// GLIBC_PRIVATE).
var glibcRe = regexp.MustCompile(`^GLIBC_([0-9]+(?:\.[0-9]+)+)$`)

// newestGlibc is the newest glibc version that needs ask for, whichever
// of glibc's libraries (libc.so.6, libm.so.6, ld-linux) they name, or ""
// when they ask for none. Versions compare number by number: 2.34 is
// newer than 2.4 and 2.3.2.
func newestGlibc(needs []elf.DynamicVersionNeed) string {
	var newest string
	for _, n := range needs {
		for _, d := range n.Needs {
			m := glibcRe.FindStringSubmatch(d.Dep)
			if m != nil && compareVersions(m[1], newest) > 0 {
				newest = m[1]
			}
		}
	}
	return newest
}

// compareVersions compares dotted numbers ("" is before every version).
func compareVersions(a, b string) int {
	num := func(v string) []int {
		var out []int
		for f := range strings.SplitSeq(v, ".") {
			if f == "" {
				continue
			}
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	return slices.Compare(num(a), num(b))
}

// LibcDepends is the libc6 dependency of the ELF programs at paths:
// "libc6 (>= X)" with X the newest glibc symbol version any of them needs
// (a program linked with cgo against glibc 2.34 does not start on a host
// with 2.31), or "" when none needs glibc (static programs). A file that
// is not an ELF program is an error: what it needs cannot be known.
func LibcDepends(paths ...string) (string, error) {
	var newest string
	for _, p := range paths {
		v, err := glibcVersion(p)
		if err != nil {
			return "", err
		}
		if compareVersions(v, newest) > 0 {
			newest = v
		}
	}
	if newest == "" {
		return "", nil
	}
	return "libc6 (>= " + newest + ")", nil
}

// glibcVersion is the newest glibc version the ELF program at p needs, ""
// for a static one.
func glibcVersion(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("debpkg: read the program %s: %w", p, err)
	}
	defer f.Close()
	if f.Section(".gnu.version_r") == nil {
		return "", nil
	}
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		return "", fmt.Errorf("debpkg: the versions %s needs: %w", p, err)
	}
	return newestGlibc(needs), nil
}

// Info is the nfpm description of the package.
func (s Spec) Info() (*nfpm.Info, error) {
	if s.Version == "" || s.Arch == "" || s.MTime.IsZero() {
		return nil, errors.New("debpkg: a build needs a version, an architecture and a modification time")
	}
	cs, err := s.Contents()
	if err != nil {
		return nil, err
	}
	var progs []string
	for _, p := range Programs {
		progs = append(progs, filepath.Join(s.Bin, p))
	}
	libc, err := LibcDepends(progs...)
	if err != nil {
		return nil, err
	}
	depends := slices.Clone(Depends)
	if libc != "" {
		depends = append([]string{libc}, depends...)
	}
	info := &nfpm.Info{
		Name:          Name,
		Arch:          s.Arch,
		Platform:      "linux",
		Version:       s.Version,
		VersionSchema: "none",
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    "mpsd maintainers <mpsd@users.noreply.github.com>",
		Homepage:      "https://github.com/mpsd/mpsd",
		Description: "shares a host's NVIDIA GPUs among tenants through CUDA MPS\n" +
			"mpsd runs one MPS control daemon per GPU set and tenant group, grants\n" +
			"leases with SM shares and memory limits (mps-launch), restarts what\n" +
			"fails and requeues the clients it affected; mpsctl operates it.",
		MTime: s.MTime,
		Overridables: nfpm.Overridables{
			Depends:    depends,
			Recommends: Recommends,
			Suggests:   Suggests,
			Contents:   cs,
			Umask:      0o022,
			Scripts: nfpm.Scripts{
				PostInstall: s.path("deploy/deb/postinst"),
				PreRemove:   s.path("deploy/deb/prerm"),
				PostRemove:  s.path("deploy/deb/postrm"),
			},
		},
	}
	for _, sc := range []string{info.Scripts.PostInstall, info.Scripts.PreRemove, info.Scripts.PostRemove} {
		if _, err := os.Stat(sc); err != nil {
			return nil, fmt.Errorf("debpkg: maintainer script: %w", err)
		}
	}
	return info, nil
}

// Build writes the package to w.
func Build(s Spec, w io.Writer) error {
	info, err := s.Info()
	if err != nil {
		return err
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return fmt.Errorf("debpkg: prepare the contents: %w", err)
	}
	if err := deb.Default.Package(info, w); err != nil {
		return fmt.Errorf("debpkg: write the package: %w", err)
	}
	return nil
}

// MTime is the files' time: SOURCE_DATE_EPOCH's (sourceDateEpoch, seconds)
// when set, else the commit's. Neither is an error: a build's time would
// make its bytes differ.
func MTime(commitTime time.Time, sourceDateEpoch string) (time.Time, error) {
	if sourceDateEpoch != "" {
		n, err := strconv.ParseInt(sourceDateEpoch, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("debpkg: SOURCE_DATE_EPOCH %q: %w", sourceDateEpoch, err)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	if commitTime.IsZero() {
		return time.Time{}, errors.New("debpkg: no time for the files: the commit's is unknown and SOURCE_DATE_EPOCH is not set")
	}
	return commitTime.UTC(), nil
}

// WriteDist builds the package into dir (made if missing) under its
// Debian name, through a temporary file renamed into place, and returns
// its path. s.Work is made and removed here when empty.
func WriteDist(s Spec, dir string) (string, error) {
	if s.Work == "" {
		work, err := os.MkdirTemp("", "debpkg-")
		if err != nil {
			return "", fmt.Errorf("debpkg: work directory: %w", err)
		}
		defer os.RemoveAll(work)
		s.Work = work
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("debpkg: create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".debpkg-*")
	if err != nil {
		return "", fmt.Errorf("debpkg: create the package: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = Build(s, tmp)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("debpkg: write the package: %w", cerr)
	}
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, FileName(s.Version, s.Arch))
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("debpkg: move the package into place: %w", err)
	}
	return dst, nil
}
