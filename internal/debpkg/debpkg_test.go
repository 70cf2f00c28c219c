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
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/policy"
)

// root is the repository's root, from this package's directory.
const root = "../.."

var commitTime = time.Date(2026, 12, 8, 14, 30, 0, 0, time.UTC)

func TestDebVersion(t *testing.T) {
	tests := []struct {
		name, stamped, want string
	}{
		{"tag", "v1.2.0", "1.2.0"},
		{"tag without v", "1.2.0", "1.2.0"},
		{"commits after a tag", "v1.2.0-12-gabc1234abc12", "1.2.0+12.gabc1234abc12"},
		{"dirty tag", "v1.2.0-dirty", "1.2.0+dirty"},
		{"dirty commits after a tag", "v1.2.0-12-gabc1234abc12-dirty", "1.2.0+12.gabc1234abc12.dirty"},
		{"prerelease", "v1.2.0-rc.1", "1.2.0~rc.1"},
		{"prerelease with a dash", "v1.2.0-rc-1", "1.2.0~rc.1"},
		{"commits after a prerelease", "v1.2.0-rc.1-3-g0123abcd0123", "1.2.0~rc.1+3.g0123abcd0123"},
		{"bare commit", "abc1234abc12", "0~git20261208.143000.gabc1234abc12"},
		{"dirty bare commit", "abc1234abc12-dirty", "0~git20261208.143000.gabc1234abc12+dirty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DebVersion(tc.stamped, commitTime)
			if err != nil || got != tc.want {
				t.Errorf("DebVersion(%q) = %q, %v; want %q", tc.stamped, got, err, tc.want)
			}
		})
	}
}

func TestDebVersionRefused(t *testing.T) {
	for _, tc := range []struct{ name, stamped string }{
		{"empty", ""},
		{"devel", "(devel)"},
		{"no digit first", "vnext"},
		{"bare commit without a time", "abc1234abc12"},
		{"git's default abbreviation", "v1.2.0-12-gabc1234"},
		{"bare commit, git's default abbreviation", "abc1234"},
		{"dirty, git's default abbreviation", "abc1234-dirty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := commitTime
			if tc.name == "bare commit without a time" {
				ct = time.Time{}
			}
			if got, err := DebVersion(tc.stamped, ct); !errors.Is(err, ErrVersion) {
				t.Errorf("DebVersion(%q) = %q, %v; want ErrVersion", tc.stamped, got, err)
			}
		})
	}
}

// TestDebVersionOrder checks with dpkg that the mapped versions sort as
// the builds do: a prerelease before its release, commits after a tag
// before the next tag, an untagged commit before every tag and after an
// earlier untagged one. A dirty work tree's build has no place among them.
func TestDebVersionOrder(t *testing.T) {
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		t.Skip("skipping: dpkg is not installed, it decides the order")
	}
	earlier := commitTime.Add(-time.Hour)
	order := []struct {
		stamped string
		at      time.Time
	}{
		{"0123abc0123a", earlier},
		{"abc1234abc12", commitTime},
		{"v0.9.0", commitTime},
		{"v1.2.0-rc.1", commitTime},
		{"v1.2.0-rc.1-3-g0123abcd0123", commitTime},
		{"v1.2.0", commitTime},
		{"v1.2.0-2-gabc1234abc12", commitTime},
		{"v1.2.0-12-gabc1234abc12", commitTime},
		{"v1.2.1", commitTime},
	}
	var prev string
	for _, o := range order {
		v, err := DebVersion(o.stamped, o.at)
		if err != nil {
			t.Fatal(err)
		}
		if prev != "" {
			if out, err := exec.Command(dpkg, "--compare-versions", prev, "lt", v).CombinedOutput(); err != nil {
				t.Errorf("dpkg: %s is not before %s (%s): %v %s", prev, v, o.stamped, err, out)
			}
		}
		prev = v
	}
}

// hostTrue is a small program linked against the host's glibc, the
// stand-in for the three programs.
const hostTrue = "/bin/true"

// fakeBin makes a bin directory with stand-ins for the three programs:
// copies of hostTrue, ELF programs that need glibc as make build's mpsd
// does.
func fakeBin(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(hostTrue)
	if err != nil {
		t.Skipf("skipping: %v: the package's programs are stood in for by it", err)
	}
	bin := t.TempDir()
	for _, p := range Programs {
		if err := os.WriteFile(filepath.Join(bin, p), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// readelfGlibc is the newest GLIBC_ version readelf -V lists for the
// program at p, as binutils sees it.
func readelfGlibc(t *testing.T, p string) string {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		t.Skip("skipping: readelf (binutils) is not installed, it checks the versions")
	}
	out, err := exec.Command("sh", "-c", `readelf -V --wide "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1`, "sh", p).Output()
	if err != nil {
		t.Fatalf("readelf -V %s: %v", p, err)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "GLIBC_")
}

func TestNewestGlibc(t *testing.T) {
	need := func(lib string, deps ...string) elf.DynamicVersionNeed {
		n := elf.DynamicVersionNeed{Name: lib}
		for _, d := range deps {
			n.Needs = append(n.Needs, elf.DynamicVersionDep{Dep: d})
		}
		return n
	}
	tests := []struct {
		name  string
		needs []elf.DynamicVersionNeed
		want  string
	}{
		{"none", nil, ""},
		{"one", []elf.DynamicVersionNeed{need("libc.so.6", "GLIBC_2.2.5")}, "2.2.5"},
		{"by number, not by text", []elf.DynamicVersionNeed{need("libc.so.6", "GLIBC_2.4", "GLIBC_2.34", "GLIBC_2.3.2", "GLIBC_2.9")}, "2.34"},
		{"a longer version of the same", []elf.DynamicVersionNeed{need("libc.so.6", "GLIBC_2.3", "GLIBC_2.3.4")}, "2.3.4"},
		{"any of glibc's libraries", []elf.DynamicVersionNeed{need("libc.so.6", "GLIBC_2.17"), need("libm.so.6", "GLIBC_2.29")}, "2.29"},
		{"private and other libraries' versions left out", []elf.DynamicVersionNeed{need("libc.so.6", "GLIBC_PRIVATE", "GLIBC_2.2.5"), need("libgcc_s.so.1", "GCC_3.0", "GCC_4.2.0")}, "2.2.5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := newestGlibc(tc.needs); got != tc.want {
				t.Errorf("newestGlibc = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLibcDepends reads the glibc version from real programs: one linked
// against glibc (as readelf sees it), a static Go program (no libc6), and
// refuses what is not an ELF program.
func TestLibcDepends(t *testing.T) {
	want := readelfGlibc(t, hostTrue)
	if want == "" {
		t.Fatalf("readelf lists no GLIBC_ version for %s", hostTrue)
	}
	dir := t.TempDir()
	static := filepath.Join(dir, "static")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cmp.Or(os.Getenv("GO"), "go"), "build", "-o", static, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build a static program: %v\n%s", err, out)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		paths []string
		want  string
		err   bool
	}{
		{"linked against glibc", []string{hostTrue}, "libc6 (>= " + want + ")", false},
		{"static and linked", []string{static, hostTrue, static}, "libc6 (>= " + want + ")", false},
		{"static alone", []string{static}, "", false},
		{"not an ELF program", []string{hostTrue, script}, "", true},
		{"missing", []string{filepath.Join(dir, "missing")}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LibcDepends(tc.paths...)
			if got != tc.want || (err != nil) != tc.err {
				t.Errorf("LibcDepends = %q, %v; want %q (error: %v)", got, err, tc.want, tc.err)
			}
		})
	}
}

func build(t *testing.T, bin string) []byte {
	t.Helper()
	var buf bytes.Buffer
	s := Spec{Root: root, Bin: bin, Version: "1.2.0+3.gabc1234abc12", Arch: "amd64", MTime: commitTime, Work: t.TempDir()}
	if err := Build(s, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sourcePathRe finds a file of package buildinfo, which every program
// has, by the path the program names it with.
var sourcePathRe = regexp.MustCompile(`[[:graph:]]*internal/buildinfo/buildinfo\.go`)

// TestDistProgramsPortable checks the programs make build left
// ($MPSD_BIN_DIR, which make test sets), as they go into the package: no
// path of the checkout in them (built with -trimpath, so that one commit
// gives the same package wherever it is checked out), and a libc6
// dependency at the glibc version binutils sees them need.
func TestDistProgramsPortable(t *testing.T) {
	bin := os.Getenv("MPSD_BIN_DIR")
	if bin == "" {
		t.Skip("skipping: MPSD_BIN_DIR is not set (make test sets it to make build's bin/)")
	}
	checkout, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, p := range Programs {
		path := filepath.Join(bin, p)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run make build)", err)
		}
		if n := bytes.Count(b, []byte(checkout+"/")); n > 0 {
			t.Errorf("%s names the checkout %s %d times: built without -trimpath", path, checkout, n)
		}
		// Wherever it was built: the program's own sources are named by
		// their import path alone.
		for _, m := range sourcePathRe.FindAll(b, -1) {
			if !bytes.HasPrefix(m, []byte("github.com/mpsd/mpsd/")) {
				t.Errorf("%s names its source file %s by a path of the machine that built it: built without -trimpath", path, m)
				break
			}
		}
		paths = append(paths, path)
	}
	got, err := LibcDepends(paths...)
	if err != nil {
		t.Fatal(err)
	}
	if want := "libc6 (>= " + readelfGlibc(t, filepath.Join(bin, "mpsd")) + ")"; got != want {
		t.Errorf("LibcDepends(make build's programs) = %q, want %q", got, want)
	}
}

// TestBuildReproducible builds the package twice from the same inputs,
// with the sources' own modification times changed in between, and wants
// the same bytes.
func TestBuildReproducible(t *testing.T) {
	bin := fakeBin(t)
	a := build(t, bin)
	later := time.Now().Add(time.Hour)
	for _, p := range Programs {
		if err := os.Chtimes(filepath.Join(bin, p), later, later); err != nil {
			t.Fatal(err)
		}
	}
	b := build(t, bin)
	if !bytes.Equal(a, b) {
		t.Fatalf("two builds from the same inputs differ (%d and %d bytes)", len(a), len(b))
	}
}

// TestBuildContents checks with dpkg-deb what the package holds: every
// installed path of the contract, the modes, the conffiles, the control
// fields and the maintainer scripts.
func TestBuildContents(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("skipping: dpkg-deb is not installed")
	}
	deb := filepath.Join(t.TempDir(), FileName("1.2.0+3.gabc1234abc12", "amd64"))
	if err := os.WriteFile(deb, build(t, fakeBin(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("dpkg-deb", "--contents", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --contents: %v\n%s", err, out)
	}
	got := map[string]string{} // path -> mode owner
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb line %q", line)
		}
		got[strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")] = f[0] + " " + f[1] + " " + f[3] + " " + f[4]
	}
	stamp := commitTime.Format("2006-01-02 15:04")
	want := map[string]string{
		"/usr/bin/mpsd":                                               "-rwxr-xr-x",
		"/usr/bin/mpsctl":                                             "-rwxr-xr-x",
		"/usr/bin/mps-launch":                                         "-rwxr-xr-x",
		"/lib/systemd/system/mpsd.service":                            "-rw-r--r--",
		"/lib/systemd/system/mpsd.socket":                             "-rw-r--r--",
		"/etc/mpsd":                                                   "drwxr-xr-x",
		"/etc/mpsd/mpsd.yaml":                                         "-rw-r--r--",
		"/etc/logrotate.d/mpsd":                                       "-rw-r--r--",
		"/usr/share/man/man8/mpsd.8.gz":                               "-rw-r--r--",
		"/usr/share/man/man8/mpsctl.8.gz":                             "-rw-r--r--",
		"/usr/share/man/man1/mps-launch.1.gz":                         "-rw-r--r--",
		"/usr/share/man/man5/mpsd.yaml.5.gz":                          "-rw-r--r--",
		"/usr/share/bash-completion/completions/mpsd":                 "-rw-r--r--",
		"/usr/share/bash-completion/completions/mpsctl":               "-rw-r--r--",
		"/usr/share/bash-completion/completions/mps-launch":           "-rw-r--r--",
		"/usr/share/zsh/vendor-completions/_mpsd":                     "-rw-r--r--",
		"/usr/share/zsh/vendor-completions/_mpsctl":                   "-rw-r--r--",
		"/usr/share/zsh/vendor-completions/_mps_launch":               "-rw-r--r--",
		"/usr/share/doc/mpsd/architecture.md":                         "-rw-r--r--",
		"/usr/share/doc/mpsd/alerts.md":                               "-rw-r--r--",
		"/usr/share/doc/mpsd/install.md":                              "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/mpsd.yaml":                      "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/logrotate/mpsd":                 "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/prometheus/mpsd-alerts.yml":     "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/grafana/mpsd.json":              "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/kubernetes/mpsd-daemonset.yaml": "-rw-r--r--",
		"/usr/share/doc/mpsd/examples/slurm/prolog.sh":                "-rw-r--r--",
	}
	for p, mode := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("the package has no %s", p)
			continue
		}
		if w := mode + " root/root"; !strings.HasPrefix(g, w) {
			t.Errorf("%s: %q, want %q", p, g, w)
		}
		if !strings.HasSuffix(g, stamp) {
			t.Errorf("%s: %q, want the time %s", p, g, stamp)
		}
	}
	for p := range got {
		if strings.HasSuffix(p, ".go") {
			t.Errorf("the package has a Go file %s", p)
		}
	}

	info, err := exec.Command("dpkg-deb", "--info", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --info: %v\n%s", err, info)
	}
	for _, w := range []string{
		"Package: mpsd", "Version: 1.2.0+3.gabc1234abc12", "Architecture: amd64",
		"Depends: libc6 (>= " + readelfGlibc(t, hostTrue) + "), " + strings.Join(Depends, ", "), "Recommends: " + strings.Join(Recommends, ", "),
		"Suggests: " + strings.Join(Suggests, ", "), "postinst", "prerm", "postrm", "conffiles",
	} {
		if !strings.Contains(string(info), w) {
			t.Errorf("dpkg-deb --info has no %q:\n%s", w, info)
		}
	}
	conf, err := exec.Command("dpkg-deb", "--field", deb, "Package").CombinedOutput()
	if err != nil || strings.TrimSpace(string(conf)) != "mpsd" {
		t.Errorf("dpkg-deb --field Package: %q, %v", conf, err)
	}
	ctrl := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "--control", deb, ctrl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --control: %v\n%s", err, out)
	}
	cf, err := os.ReadFile(filepath.Join(ctrl, "conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(cf)), []string{LogrotateFile, ConfigFile}; !slices.Equal(got, want) {
		t.Errorf("conffiles %v, want %v", got, want)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		fi, err := os.Stat(filepath.Join(ctrl, s))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("maintainer script %s: %v, %v; want mode 0755", s, fi, err)
		}
	}
}

// TestManPagesGzipped checks that the man pages are gzipped as gzip -n
// does: no name and no time in the header, and the page unchanged.
func TestManPagesGzipped(t *testing.T) {
	s := Spec{Root: root, Work: t.TempDir()}
	es, err := s.manPages()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 4 {
		t.Fatalf("%d man pages, want 4 (mpsd.8, mpsctl.8, mps-launch.1, mpsd.yaml.5)", len(es))
	}
	for _, e := range es {
		f, err := os.Open(e.src)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		if zr.Name != "" || !zr.ModTime.IsZero() {
			t.Errorf("%s: gzip header name %q time %v, want neither", e.dst, zr.Name, zr.ModTime)
		}
		b, err := io.ReadAll(zr)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		page := strings.TrimSuffix(filepath.Base(e.dst), ".gz")
		src, err := os.ReadFile(filepath.Join(root, "docs", "man", page))
		if err != nil || !bytes.Equal(b, src) {
			t.Errorf("%s does not hold docs/man/%s (%v)", e.dst, page, err)
		}
		if sec := page[strings.LastIndexByte(page, '.')+1:]; !strings.HasPrefix(e.dst, ManDir+"/man"+sec+"/") {
			t.Errorf("%s is not in section %s's directory", e.dst, sec)
		}
	}
}

// TestContentsMissingFile: a package that would lack one of its files is
// not built.
func TestContentsMissingFile(t *testing.T) {
	bin := fakeBin(t)
	if err := os.Remove(filepath.Join(bin, "mpsctl")); err != nil {
		t.Fatal(err)
	}
	s := Spec{Root: root, Bin: bin, Version: "1.2.0", Arch: "amd64", MTime: commitTime, Work: t.TempDir()}
	if err := Build(s, io.Discard); err == nil || !strings.Contains(err.Error(), "mpsctl") {
		t.Errorf("Build without bin/mpsctl: %v, want an error naming it", err)
	}
}

// TestMaintainerScriptsShellcheck runs shellcheck on the maintainer
// scripts (POSIX sh, as dpkg runs them).
func TestMaintainerScriptsShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("skipping: shellcheck is not installed (apt-get install shellcheck; .ci/run installs it)")
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		p := filepath.Join(root, "deploy", "deb", s)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("#!/bin/sh\n")) || !bytes.Contains(b, []byte("\nset -e\n")) {
			t.Errorf("%s: want #!/bin/sh and set -e", s)
		}
		if out, err := exec.Command(sc, "--shell=sh", "--severity=style", p).CombinedOutput(); err != nil {
			t.Errorf("shellcheck %s: %v\n%s", s, err, out)
		}
	}
}

// testUsers resolves the names the default config names.
type testUsers struct{}

func (testUsers) UserID(name string) (uint32, error) {
	if name == "root" {
		return 0, nil
	}
	return 0, fmt.Errorf("no user %s", name)
}

func (testUsers) GroupID(name string) (uint32, error) { return 0, fmt.Errorf("no group %s", name) }

// TestDefaultConfigStarts: the config the package installs is valid on a
// host with GPUs, the smallest that mpsd serves (one 2 GiB card, such as a
// T400, less what NVML does not report) as much as eight H100s, and names
// the units' socket.
func TestDefaultConfigStarts(t *testing.T) {
	const gib, mib = int64(1) << 30, int64(1) << 20
	hosts := map[string][]policy.GPU{
		"one 2 GiB GPU": {{Index: 0, UUID: "GPU-00000000-0000-4000-8000-000000000000", Memory: 2*gib - 64*mib}},
		"one 8 GiB GPU": {{Index: 0, UUID: "GPU-00000000-0000-4000-8000-000000000000", Memory: 8 * gib}},
	}
	h100 := make([]policy.GPU, 8)
	for i := range h100 {
		h100[i] = policy.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i), Memory: 85520809984}
	}
	hosts["eight H100"] = h100
	for name, gpus := range hosts {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(filepath.Join(root, "deploy", "deb", "mpsd.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c, err := policy.Parse(f, policy.Host{GPUs: gpus, Users: testUsers{}})
			if err != nil {
				t.Fatalf("deploy/deb/mpsd.yaml: %v", err)
			}
			if len(c.Groups) != 1 || len(c.Groups[0].Instances) != len(gpus) {
				t.Errorf("groups %+v, want one with an instance per GPU", c.Groups)
			}
			if c.Socket != "/run/mpsd/mpsd.sock" || c.StateDir != "/var/lib/mpsd" || c.LogDir != "/var/log/mpsd" {
				t.Errorf("socket %s, state_dir %s, log_dir %s: want the units' socket and the directories postinst makes", c.Socket, c.StateDir, c.LogDir)
			}
		})
	}
}

func TestMTime(t *testing.T) {
	tests := []struct {
		name   string
		commit time.Time
		epoch  string
		want   time.Time
		err    bool
	}{
		{"the commit's", commitTime, "", commitTime, false},
		{"SOURCE_DATE_EPOCH first", commitTime, "946684800", time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"SOURCE_DATE_EPOCH alone", time.Time{}, "946684800", time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"neither", time.Time{}, "", time.Time{}, true},
		{"SOURCE_DATE_EPOCH not a number", commitTime, "yesterday", time.Time{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MTime(tc.commit, tc.epoch)
			if (err != nil) != tc.err || !got.Equal(tc.want) {
				t.Errorf("MTime(%v, %q) = %v, %v; want %v (error: %v)", tc.commit, tc.epoch, got, err, tc.want, tc.err)
			}
		})
	}
}

// TestWriteDist writes the package under its Debian name, readable by
// all, with the bytes Build gives, and leaves nothing else behind.
func TestWriteDist(t *testing.T) {
	bin := fakeBin(t)
	dir := filepath.Join(t.TempDir(), "dist")
	s := Spec{Root: root, Bin: bin, Version: "1.2.0+3.gabc1234abc12", Arch: "amd64", MTime: commitTime}
	p, err := WriteDist(s, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "mpsd_1.2.0+3.gabc1234abc12_amd64.deb"); p != want {
		t.Errorf("WriteDist wrote %s, want %s", p, want)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the package: %v, %v; want mode 0644", fi, err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, build(t, bin)) {
		t.Errorf("WriteDist's package differs from Build's")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("dist holds %d entries, want the package alone", len(ents))
	}
}
