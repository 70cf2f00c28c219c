package main

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The acceptance check of the image's reproducibility: two builds, by two
// runs of the builder program into two directories, from the same
// inputs, give the same archive, byte for byte, and the same manifest
// digest; a changed input changes the digest.

// imageRequireEnv=1 (CI) makes a missing dist/mpsd-image.tar a failure
// instead of a skip.
const imageRequireEnv = "MPSD_REQUIRE_IMAGE"

// builder builds this program into a temporary directory.
func builder(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "mpsd-image")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
}

// inputs are one build's inputs.
type inputs struct {
	bin     string   // the programs' directory
	base    []string // the packages' data archives
	ldflags string
}

// buildImage runs the builder on in, writing into a directory of its own, and
// returns the archive's bytes and the manifest digest it printed.
func buildImage(t *testing.T, exe string, in inputs) ([]byte, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "mpsd-image.tar")
	args := []string{"-out", out, "-bin", in.bin, "-ldflags", in.ldflags}
	for _, b := range in.base {
		args = append(args, "-base", b)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("mpsd-image %v: %v\n%s", args, err, stderr.Bytes())
	}
	f := strings.Fields(string(stdout))
	if len(f) != 3 || f[0] != out || !strings.HasPrefix(f[2], "sha256:") {
		t.Fatalf("mpsd-image printed %q; want the archive, the reference and the digest", stdout)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b, f[2]
}

// dataArchive writes a package's data archive holding the file name
// (and its directory ./lib/) into dir.
func dataArchive(t *testing.T, dir, name string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "./lib/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: 4},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("libc"))
		}
	}
	tw.Close()
	path := filepath.Join(dir, filepath.Base(name)+".tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeInputs writes programs and a package's data archive of a few bytes
// each under dir.
func fakeInputs(t *testing.T, dir string) inputs {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"mpsd", "mpsctl", "mps-launch"} {
		if err := os.WriteFile(filepath.Join(bin, p), []byte("#!"+p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := dataArchive(t, dir, "./lib/libc.so.6")
	const pkg = "github.com/mpsd/mpsd/internal/buildinfo"
	return inputs{bin: bin, base: []string{base},
		ldflags: "-X " + pkg + ".version=v1.2.0 -X " + pkg + ".commit=0123456789abcdef0123456789abcdef01234567 -X " + pkg + ".commitTime=2026-12-01T14:00:00Z"}
}

func TestReproducible(t *testing.T) {
	exe := builder(t)
	dir := t.TempDir()
	in := fakeInputs(t, dir)
	a, digestA := buildImage(t, exe, in)
	b, digestB := buildImage(t, exe, in)
	if digestA != digestB || !bytes.Equal(a, b) {
		t.Fatalf("two builds of the same inputs: digests %s and %s, archives equal %v", digestA, digestB, bytes.Equal(a, b))
	}

	// Each input counts: a program's byte, a package's file, the commit's
	// time, the version.
	for _, tc := range []struct {
		name   string
		change func(t *testing.T) inputs
	}{
		{"a program", func(t *testing.T) inputs {
			if err := os.WriteFile(filepath.Join(in.bin, "mps-launch"), []byte("#!mps-launcH"), 0o755); err != nil {
				t.Fatal(err)
			}
			return in
		}},
		{"a package", func(t *testing.T) inputs {
			c := in
			c.base = append([]string{dataArchive(t, t.TempDir(), "./lib/libm.so.6")}, in.base...)
			return c
		}},
		{"the commit's time", func(t *testing.T) inputs {
			c := in
			c.ldflags = strings.Replace(in.ldflags, "14:00:00Z", "14:00:01Z", 1)
			return c
		}},
		{"the version", func(t *testing.T) inputs {
			c := in
			c.ldflags = strings.Replace(in.ldflags, "v1.2.0", "v1.2.1", 1)
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved, _ := os.ReadFile(filepath.Join(in.bin, "mps-launch"))
			t.Cleanup(func() { _ = os.WriteFile(filepath.Join(in.bin, "mps-launch"), saved, 0o755) })
			if _, digest := buildImage(t, exe, tc.change(t)); digest == digestA {
				t.Errorf("a changed %s left the digest at %s", tc.name, digest)
			}
		})
	}
}

// TestDistImageReproducible rebuilds make package-image's archive
// ($MPSD_DIST_DIR/mpsd-image.tar) twice from the same commit, with the
// programs make build left ($MPSD_BIN_DIR), the same Debian packages
// (hack/fetch-image-debs.sh) and the same stamp (hack/ldflags.sh): both
// builds give make's bytes and digest.
func TestDistImageReproducible(t *testing.T) {
	dist := os.Getenv("MPSD_DIST_DIR")
	archive := filepath.Join(dist, "mpsd-image.tar")
	if _, err := os.Stat(archive); dist == "" || err != nil {
		msg := "no image archive in $MPSD_DIST_DIR (make package-image; make test does)"
		if os.Getenv(imageRequireEnv) == "1" {
			t.Fatalf("%s (%s=1)", msg, imageRequireEnv)
		}
		t.Skip(msg)
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("MPSD_BIN_DIR")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	script := func(name string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "hack", name))
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("hack/%s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	in := inputs{bin: bin, base: strings.Fields(script("fetch-image-debs.sh")), ldflags: script("ldflags.sh")}
	want, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	exe := builder(t)
	a, digestA := buildImage(t, exe, in)
	b, digestB := buildImage(t, exe, in)
	if digestA != digestB || !bytes.Equal(a, b) {
		t.Fatalf("two builds from this commit: digests %s and %s, archives equal %v", digestA, digestB, bytes.Equal(a, b))
	}
	if !bytes.Equal(a, want) {
		t.Errorf("a build from this commit differs from make package-image's %s (built from another commit or other programs?); digest %s", archive, digestA)
	}
	t.Logf("%s: digest %s, %d bytes, twice", archive, digestA, len(a))
}
