package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/ociimage"
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
	status  []string // their control paragraphs
	ldflags string
}

// buildImage runs the builder on in, writing into a directory of its own, and
// returns the archive's bytes and the manifest digest it printed.
func buildImage(t *testing.T, exe string, in inputs) ([]byte, string) {
	t.Helper()
	return buildImageIn(t, exe, in, "", "022")
}

// buildImageIn is buildImage with the builder in time zone tz (the
// environment's when "") under umask.
func buildImageIn(t *testing.T, exe string, in inputs, tz, umask string) ([]byte, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "mpsd-image.tar")
	args := []string{"-out", out, "-bin", in.bin, "-ldflags", in.ldflags}
	for _, b := range in.base {
		args = append(args, "-base", b)
	}
	for _, s := range in.status {
		args = append(args, "-status", s)
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", `umask "$0" && exec "$@"`, umask, exe}, args...)...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=")
	if tz != "" {
		cmd.Env = append(cmd.Env, "TZ="+tz)
	}
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
	control := filepath.Join(dir, "libc6.control")
	if err := os.WriteFile(control, []byte("Package: libc6\nVersion: 2.36-9+deb12u14\nArchitecture: amd64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return inputs{bin: bin, base: []string{base}, status: []string{control},
		ldflags: "-X " + pkg + ".version=v1.2.0 -X " + pkg + ".commit=0123456789abcdef0123456789abcdef01234567 -X " + pkg + ".commitTime=2026-12-01T14:00:00Z"}
}

// copyInputs copies in's files under dir, each with the given mtime and
// permission bits g+w (what another umask or checkout gives).
func copyInputs(t *testing.T, in inputs, dir string, mtime time.Time) inputs {
	t.Helper()
	c := inputs{bin: filepath.Join(dir, "programs"), ldflags: in.ldflags}
	if err := os.Mkdir(c.bin, 0o775); err != nil {
		t.Fatal(err)
	}
	cp := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, st.Mode().Perm()|0o020); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(to, st.Mode().Perm()|0o020); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(to, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"mpsd", "mpsctl", "mps-launch"} {
		cp(filepath.Join(in.bin, p), filepath.Join(c.bin, p))
	}
	for i, b := range in.base {
		to := filepath.Join(dir, fmt.Sprintf("base-%d.tar", i))
		cp(b, to)
		c.base = append(c.base, to)
	}
	for i, s := range in.status {
		to := filepath.Join(dir, fmt.Sprintf("base-%d.control", i))
		cp(s, to)
		c.status = append(c.status, to)
	}
	return c
}

func TestReproducible(t *testing.T) {
	exe := builder(t)
	dir := t.TempDir()
	in := fakeInputs(t, dir)
	a, digestA := buildImage(t, exe, in)
	// The second build: the inputs copied to other paths, with other
	// times and modes, the builder in another time zone and umask.
	elsewhere := copyInputs(t, in, t.TempDir(), time.Now().Add(time.Hour))
	b, digestB := buildImageIn(t, exe, elsewhere, "Pacific/Chatham", "077")
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
		{"a package's control", func(t *testing.T) inputs {
			c := in
			control := filepath.Join(t.TempDir(), "libc6.control")
			if err := os.WriteFile(control, []byte("Package: libc6\nVersion: 2.36-9+deb12u15\nArchitecture: amd64\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			c.status = []string{control}
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
	for _, b := range in.base {
		in.status = append(in.status, strings.TrimSuffix(b, ".tar")+".control")
	}
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

// TestDistRebuiltElsewhere checks the claim of the docs: one commit gives
// the same image and package wherever it is built. It copies this
// checkout's files (git's tracked and untracked ones, as a release
// tarball or another clone holds them) to another path, writes there the
// VERSION file of what hack/ldflags.sh stamps here (the copy has no git),
// and builds the programs, the package and the image again there (make
// programs package-deb package-image): each is byte for byte what make
// left in $MPSD_BIN_DIR and $MPSD_DIST_DIR. -trimpath keeps the checkout's
// path out of the programs; the Go build cache makes the second build
// cheap.
func TestDistRebuiltElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the programs again (-short)")
	}
	dist := os.Getenv("MPSD_DIST_DIR")
	archive := filepath.Join(dist, "mpsd-image.tar")
	debs, _ := filepath.Glob(filepath.Join(dist, "mpsd_*.deb"))
	if _, err := os.Stat(archive); dist == "" || err != nil || len(debs) != 1 {
		msg := "no image archive and package in $MPSD_DIST_DIR (make package-image package-deb; make test does)"
		if os.Getenv(imageRequireEnv) == "1" {
			t.Fatalf("%s (%s=1)", msg, imageRequireEnv)
		}
		t.Skip(msg)
	}
	for _, tool := range []string{"git", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on this host", tool)
		}
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("MPSD_BIN_DIR")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	ldflags := exec.Command(filepath.Join(root, "hack", "ldflags.sh"))
	ldflags.Dir = root
	flags, err := ldflags.Output()
	if err != nil {
		t.Fatalf("hack/ldflags.sh: %v", err)
	}
	stamp, err := ociimage.ParseLdflags(string(flags))
	if err != nil || stamp.Version == "" {
		t.Fatalf("hack/ldflags.sh stamps %q: %v; want a version", flags, err)
	}

	// The copy, at a path of another length and name.
	copyDir := filepath.Join(t.TempDir(), "elsewhere", "mpsd-src")
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	list, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00") {
		copyFile(t, filepath.Join(root, name), filepath.Join(copyDir, name))
	}
	version := fmt.Sprintf("%s %s %s\n", stamp.Version, stamp.Commit, stamp.Time.Format(time.RFC3339))
	if err := os.WriteFile(filepath.Join(copyDir, "VERSION"), []byte(version), 0o644); err != nil {
		t.Fatal(err)
	}
	// build's other work (the emulator, go build ./...) is not packaged:
	// -o build leaves it out.
	mk := exec.Command("make", "--no-print-directory", "-o", "build", "programs", "package-deb", "package-image")
	mk.Dir = copyDir
	mk.Env = append(os.Environ(), "MPSD_DIST_DIR="+filepath.Join(copyDir, "dist"), "MAKEFLAGS=")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make programs package-deb package-image in %s: %v\n%s", copyDir, err, out)
	}

	for _, p := range ociimage.Programs {
		if !sameFile(t, filepath.Join(bin, p), filepath.Join(copyDir, "bin", p)) {
			t.Errorf("%s built at %s differs from %s's", p, copyDir, bin)
		}
	}
	for _, f := range []string{archive, debs[0]} {
		if !sameFile(t, f, filepath.Join(copyDir, "dist", filepath.Base(f))) {
			t.Errorf("%s built again at %s differs (or is missing there)", f, copyDir)
		}
	}
}

// copyFile copies a regular file (with its mode) or a symbolic link,
// making its directory; a tracked file deleted from the work tree is
// left out, as a clone of the tree would.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	st, err := os.Lstat(from)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(from)
		if err == nil {
			err = os.Symlink(target, to)
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, st.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

// sameFile says whether a and b exist and hold the same bytes.
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, errA := os.ReadFile(a)
	y, errB := os.ReadFile(b)
	if errA != nil || errB != nil {
		t.Logf("compare %s and %s: %v, %v", a, b, errA, errB)
		return false
	}
	return bytes.Equal(x, y)
}

// TestFetchImageDebsVerifies runs hack/fetch-image-debs.sh on a cache of
// its own seeded with the packages make package-image fetched: a cached
// package whose unpacked files differ from what dpkg installed here is
// refused, naming the file, every run; the real package passes.
func TestFetchImageDebsVerifies(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb: the image's packages come from a Debian host")
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "hack", "fetch-image-debs.sh")
	fetch := func(cache string) (string, error) {
		cmd := exec.Command(script)
		cmd.Env = append(os.Environ(), "MPSD_IMAGE_DEBS_CACHE="+cache)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The real cache: what make package-image fetched (else fetched now).
	out, err := exec.Command(script).Output()
	if err != nil {
		t.Skipf("hack/fetch-image-debs.sh cannot fetch here: %v", err)
	}
	tars := strings.Fields(string(out))
	if len(tars) == 0 {
		t.Fatal("hack/fetch-image-debs.sh printed no tar")
	}

	cache := t.TempDir()
	for _, tr := range tars {
		deb := strings.TrimSuffix(tr, ".tar") + ".deb"
		copyFile(t, deb, filepath.Join(cache, filepath.Base(deb)))
	}
	if out, err := fetch(cache); err != nil {
		t.Fatalf("the installed packages, unpacked again: %v\n%s", err, out)
	}

	// One byte of a library in the cached tar of the first package.
	victim := filepath.Join(cache, filepath.Base(tars[0]))
	// A changed library (dpkg's md5sums), then a changed conffile
	// (dpkg's status) of the first package.
	for _, lib := range []string{"/lib/x86_64-linux-gnu/lib", "etc/"} {
		changed := tamper(t, victim, lib)
		out2, err := fetch(cache)
		if err == nil || !strings.Contains(out2, "is not the package installed here") || !strings.Contains(out2, strings.TrimPrefix(changed, "./")) {
			t.Errorf("a changed file %s in %s: %v\n%s; want refused, naming it", changed, victim, err, out2)
		}
	}
}

// tamper changes one byte of the first file in the tar at p whose name
// holds lib, in place, and returns its name.
func tamper(t *testing.T, p, lib string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(b))
	changed := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if changed == "" && h.Typeflag == tar.TypeReg && strings.Contains(h.Name, lib) && len(body) > 0 {
			body[len(body)/2] ^= 0xff
			changed = h.Name
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if changed == "" {
		t.Fatalf("%s holds no shared library", p)
	}
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return changed
}

// TestDistImageScannable reads make package-image's archive: the image
// lists each of its packages in /var/lib/dpkg/status.d at the version
// installed here (what scanners such as Trivy read), and holds each
// package's copyright file.
func TestDistImageScannable(t *testing.T) {
	dist := os.Getenv("MPSD_DIST_DIR")
	archive := filepath.Join(dist, "mpsd-image.tar")
	if _, err := os.Stat(archive); dist == "" || err != nil {
		msg := "no image archive in $MPSD_DIST_DIR (make package-image; make test does)"
		if os.Getenv(imageRequireEnv) == "1" {
			t.Fatalf("%s (%s=1)", msg, imageRequireEnv)
		}
		t.Skip(msg)
	}
	files := imageFiles(t, archive)
	for _, pkg := range []string{"libc6", "libgcc-s1"} {
		status, ok := files["var/lib/dpkg/status.d/"+pkg]
		if !ok {
			t.Errorf("the image has no var/lib/dpkg/status.d/%s", pkg)
			continue
		}
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", pkg).Output()
		if err != nil {
			t.Fatalf("dpkg-query %s: %v", pkg, err)
		}
		if !strings.Contains(status, "\nVersion: "+string(out)+"\n") || !strings.Contains(status, "\nStatus: install ok installed\n") {
			t.Errorf("status.d/%s:\n%s\nwant Version: %s, installed", pkg, status, out)
		}
	}
	for _, f := range []string{"usr/share/doc/libc6/copyright", "usr/share/doc/libgcc-s1"} {
		if _, ok := files[f]; !ok {
			t.Errorf("the image has no %s", f)
		}
	}
	if link := files["usr/share/doc/libgcc-s1"]; link != "" {
		if _, ok := files["usr/share/doc/"+link+"/copyright"]; !ok {
			t.Errorf("usr/share/doc/libgcc-s1 links to %s, which has no copyright file in the image", link)
		}
	}
}

// imageFiles reads the image in an archive: each regular file's body and
// each link's target by name, over all its layers.
func imageFiles(t *testing.T, archive string) map[string]string {
	t.Helper()
	blobs := map[string][]byte{}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if blobs[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	var index struct{ Manifests []struct{ Digest string } }
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("%s: index.json: %v", archive, err)
	}
	blob := func(digest string) []byte { return blobs["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")] }
	var manifest struct{ Layers []struct{ Digest string } }
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, l := range manifest.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(blob(l.Digest)))
		if err != nil {
			t.Fatal(err)
		}
		lr := tar.NewReader(zr)
		for {
			h, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch h.Typeflag {
			case tar.TypeReg:
				b, err := io.ReadAll(lr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = string(b)
			case tar.TypeSymlink:
				files[h.Name] = h.Linkname
			}
		}
	}
	return files
}
