package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// created is the tests' commit time.
var created = time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)

func TestTag(t *testing.T) {
	for _, tc := range []struct{ name, version, want string }{
		{"release", "v1.2.0", "v1.2.0"},
		{"describe", "v1.2.0-3-g0123abc-dirty", "v1.2.0-3-g0123abc-dirty"},
		{"commit only", "bc8322f", "bc8322f"},
		{"plus", "1.2.0+deb1", "1.2.0-deb1"},
		{"colon and tilde", "1:2.0~rc1", "1-2.0-rc1"},
		{"leading dot", ".1", "_1"},
		{"leading dash", "-x", "_x"},
		{"underscore", "_x", "_x"},
		{"empty", "", "latest"},
		{"long", strings.Repeat("a", 200), strings.Repeat("a", 128)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Tag(tc.version); got != tc.want {
				t.Errorf("Tag(%q) = %q, want %q", tc.version, got, tc.want)
			}
		})
	}
	if got, want := FullName("1.2.0+deb1"), "docker.io/library/mpsd:1.2.0-deb1"; got != want {
		t.Errorf("FullName = %q, want %q", got, want)
	}
}

func TestParseLdflags(t *testing.T) {
	const pkg = "github.com/mpsd/mpsd/internal/buildinfo"
	for _, tc := range []struct {
		name, flags string
		want        Stamp
		err         bool
	}{
		{"hack/ldflags.sh", "-X " + pkg + ".version=v1.2.0-3-gabc -X " + pkg + ".commit=0123 -X " + pkg + ".commitTime=2026-12-01T14:00:00Z",
			Stamp{Version: "v1.2.0-3-gabc", Commit: "0123", Time: created}, false},
		{"none", "", Stamp{}, false},
		{"no time", "-X " + pkg + ".version=v1 -X " + pkg + ".commit= -X " + pkg + ".commitTime=", Stamp{Version: "v1"}, false},
		{"another package", "-X example.com/x.version=v9", Stamp{}, false},
		{"bad time", "-X " + pkg + ".commitTime=yesterday", Stamp{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLdflags(tc.flags)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ParseLdflags(%q) = %+v, %v; want %+v, error %v", tc.flags, got, err, tc.want, tc.err)
			}
		})
	}
}

type header struct {
	name     string
	typ      byte
	mode     int64
	linkname string
	body     string
}

// readLayer lists a layer's entries and checks what every entry of a
// layer must be: root's, dated mtime, no user or group names.
func readLayer(t *testing.T, b []byte, mtime time.Time) []header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(mtime) || !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: uid %d gid %d (%q %q) mtime %v atime %v ctime %v; want root's, dated %v only", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, h.AccessTime, h.ChangeTime, mtime)
		}
		body, _ := io.ReadAll(tr)
		out = append(out, header{h.Name, h.Typeflag, h.Mode, h.Linkname, string(body)})
	}
}

func TestLayer(t *testing.T) {
	entries := []Entry{
		{Name: "usr/bin/mpsd", Type: tar.TypeReg, Mode: 0o755, Body: []byte("mpsd")},
		{Name: "./etc/passwd", Type: tar.TypeReg, Mode: 0o644, Body: []byte("root")},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "lib64/ld-linux-x86-64.so.2", Type: tar.TypeSymlink, Mode: 0o777, Linkname: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		{Name: "/etc/passwd", Type: tar.TypeReg, Mode: 0o644, Body: []byte("root")}, // the same twice
	}
	b, err := Layer(entries, created)
	if err != nil {
		t.Fatal(err)
	}
	want := []header{
		{"etc/", tar.TypeDir, 0o755, "", ""},
		{"etc/passwd", tar.TypeReg, 0o644, "", "root"},
		{"lib64/", tar.TypeDir, 0o755, "", ""},
		{"lib64/ld-linux-x86-64.so.2", tar.TypeSymlink, 0o777, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", ""},
		{"tmp/", tar.TypeDir, 0o1777, "", ""},
		{"usr/", tar.TypeDir, 0o755, "", ""},
		{"usr/bin/", tar.TypeDir, 0o755, "", ""},
		{"usr/bin/mpsd", tar.TypeReg, 0o755, "", "mpsd"},
	}
	if got := readLayer(t, b, created); !slices.Equal(got, want) {
		t.Errorf("layer entries:\n%+v\nwant\n%+v", got, want)
	}
	// The order entries come in does not matter.
	rev := slices.Clone(entries)
	slices.Reverse(rev)
	b2, err := Layer(rev, created)
	if err != nil || !bytes.Equal(b, b2) {
		t.Errorf("the same entries in another order give other bytes (%v)", err)
	}
	// The time does.
	if b3, err := Layer(entries, created.Add(time.Second)); err != nil || bytes.Equal(b, b3) {
		t.Errorf("another mtime gives the same bytes (%v)", err)
	}
}

func TestLayerRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []Entry
		want    error
	}{
		{"one file twice, differently", []Entry{
			{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Body: []byte("a")},
			{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Body: []byte("b")},
		}, ErrConflict},
		{"a file as a directory", []Entry{
			{Name: "etc", Type: tar.TypeReg, Mode: 0o644},
			{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644},
		}, ErrConflict},
		{"out of the root", []Entry{{Name: "../etc/passwd", Type: tar.TypeReg, Mode: 0o644}}, ErrName},
		{"setuid", []Entry{{Name: "usr/bin/su", Type: tar.TypeReg, Mode: 0o4755}}, ErrSetID},
		{"setgid", []Entry{{Name: "usr/bin/wall", Type: tar.TypeReg, Mode: 0o2755}}, ErrSetID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Layer(tc.entries, created); !errors.Is(err, tc.want) {
				t.Errorf("Layer: %v; want %v", err, tc.want)
			}
		})
	}
}

// debData is a package's data archive as dpkg-deb --fsys-tarfile writes
// it (./ names, owners, times), with what ReadTar must leave out.
func debData(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	when := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./lib/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./lib/libc.so.6", Typeflag: tar.TypeReg, Mode: 0o755, Size: 4, Uid: 1000, Uname: "builder"},
		{Name: "./lib/libc-2.36.so", Typeflag: tar.TypeLink, Linkname: "./lib/libc.so.6"},
		{Name: "./lib64/ld.so", Typeflag: tar.TypeSymlink, Linkname: "../lib/ld.so", Mode: 0o777},
		{Name: "./usr/share/doc/libc6/copyright", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./usr/share/doc/libc6/changelog.gz", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./usr/share/doc/libgcc-s1", Typeflag: tar.TypeSymlink, Linkname: "gcc-12-base", Mode: 0o777},
		{Name: "./usr/share/locale/de/LC_MESSAGES/libc.mo", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./usr/share/man/man1/ldd.1.gz", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./usr/share/doc-base/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "./run/fifo", Typeflag: tar.TypeFifo, Mode: 0o600},
		{Name: "./usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 4},
		{Name: "./usr/bin/wall", Typeflag: tar.TypeReg, Mode: 0o2755, Size: 4},
		{Name: "./var/mail/", Typeflag: tar.TypeDir, Mode: 0o2775},
	} {
		h.ModTime = when
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("elf!")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestReadTar(t *testing.T) {
	got, err := ReadTar(bytes.NewReader(debData(t)))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Name: "lib", Type: tar.TypeDir, Mode: 0o755},
		{Name: "lib/libc.so.6", Type: tar.TypeReg, Mode: 0o755, Body: []byte("elf!")},
		{Name: "lib/libc-2.36.so", Type: tar.TypeReg, Body: []byte("elf!")},
		{Name: "lib64/ld.so", Type: tar.TypeSymlink, Mode: 0o777, Linkname: "../lib/ld.so"},
		{Name: "usr/share/doc/libc6/copyright", Type: tar.TypeReg, Mode: 0o644, Body: []byte("elf!")}, // licenses stay
		{Name: "usr/share/doc/libgcc-s1", Type: tar.TypeSymlink, Mode: 0o777, Linkname: "gcc-12-base"},
		{Name: "usr/share/doc-base", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/su", Type: tar.TypeReg, Mode: 0o755, Body: []byte("elf!")},   // setuid dropped
		{Name: "usr/bin/wall", Type: tar.TypeReg, Mode: 0o755, Body: []byte("elf!")}, // setgid dropped
		{Name: "var/mail", Type: tar.TypeDir, Mode: 0o2775},                          // a directory keeps its setgid
	}
	if !slices.EqualFunc(got, want, func(a, b Entry) bool { return a.Name == b.Name && a.same(b) }) {
		t.Errorf("ReadTar:\n%+v\nwant\n%+v", got, want)
	}

	for _, tc := range []struct {
		name string
		h    tar.Header
		want error
	}{
		{"dot-dot", tar.Header{Name: "./../etc/passwd", Typeflag: tar.TypeReg}, ErrName},
		{"hard link to nothing", tar.Header{Name: "./a", Typeflag: tar.TypeLink, Linkname: "./b"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			if err := tw.WriteHeader(&tc.h); err != nil {
				t.Fatal(err)
			}
			tw.Close()
			_, err := ReadTar(&buf)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("ReadTar: %v; want an error (%v)", err, tc.want)
			}
		})
	}
}

func FuzzReadTar(f *testing.F) {
	f.Add([]byte{})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "./a", Typeflag: tar.TypeReg, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.WriteHeader(&tar.Header{Name: "./b", Typeflag: tar.TypeLink, Linkname: "./a"})
	tw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := ReadTar(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Name == "" || strings.HasPrefix(e.Name, "/") || slices.Contains(strings.Split(e.Name, "/"), "..") || stripped(e.Name, e.Type) {
				t.Errorf("ReadTar gave entry %q", e.Name)
			}
			if e.Type == tar.TypeReg && e.Mode&setID != 0 {
				t.Errorf("ReadTar gave %s with set-id mode %o", e.Name, e.Mode)
			}
			if e.Type != tar.TypeReg && e.Type != tar.TypeDir && e.Type != tar.TypeSymlink {
				t.Errorf("ReadTar gave %s of type %q", e.Name, e.Type)
			}
		}
		// Whatever it reads, a layer can hold (or refuses as a conflict).
		if _, err := Layer(entries, created); err != nil && !errors.Is(err, ErrConflict) {
			t.Errorf("Layer of ReadTar's entries: %v", err)
		}
	})
}

func testSpec(t *testing.T) Spec {
	t.Helper()
	base, err := ReadTar(bytes.NewReader(debData(t)))
	if err != nil {
		t.Fatal(err)
	}
	return Spec{
		Version: "v1.2.0+deb1", Revision: "0123456789abcdef0123456789abcdef01234567", Created: created, Arch: "amd64",
		Base:     base,
		Programs: map[string][]byte{"mpsd": []byte("mpsd"), "mpsctl": []byte("mpsctl"), "mps-launch": []byte("mps-launch")},
	}
}

// TestImageConfig compares the image's config with
// testdata/config.golden.json: entrypoint, environment, labels, the
// creation and history times, and the layers' diff ids (so a layer that
// changes shows here too).
func TestImageConfig(t *testing.T) {
	img, err := Image(testSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	pretty.WriteByte('\n')
	golden := filepath.Join("testdata", "config.golden.json")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Errorf("the image's config:\n%s\nwant (%s; go test -update rewrites it):\n%s", pretty.Bytes(), golden, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/mpsd"}) || !cf.Created.Equal(created) || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Errorf("config: entrypoint %v, created %v, platform %s/%s; want /usr/bin/mpsd, %v, linux/amd64", cf.Config.Entrypoint, cf.Created, cf.OS, cf.Architecture, created)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers %v, %v; want the user space's and the programs'", layers, err)
	}
	files := map[string]header{}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Errorf("layer media type %s", mt)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range readLayer(t, b, created) {
			files[h.name] = h
		}
	}
	for name, want := range map[string]header{
		"usr/bin/mpsd":                  {"usr/bin/mpsd", tar.TypeReg, 0o755, "", "mpsd"},
		"usr/bin/mpsctl":                {"usr/bin/mpsctl", tar.TypeReg, 0o755, "", "mpsctl"},
		"usr/bin/mps-launch":            {"usr/bin/mps-launch", tar.TypeReg, 0o755, "", "mps-launch"},
		"lib/libc.so.6":                 {"lib/libc.so.6", tar.TypeReg, 0o755, "", "elf!"},
		"etc/passwd":                    {"etc/passwd", tar.TypeReg, 0o644, "", "root:x:0:0:root:/root:/usr/sbin/nologin\n"},
		"etc/group":                     {"etc/group", tar.TypeReg, 0o644, "", "root:x:0:\n"},
		"tmp/":                          {"tmp/", tar.TypeDir, 0o1777, "", ""},
		"usr/share/doc/libc6/copyright": {"usr/share/doc/libc6/copyright", tar.TypeReg, 0o644, "", "elf!"},
	} {
		if got := files[name]; got != want {
			t.Errorf("the image's %s: %+v; want %+v", name, got, want)
		}
	}
	for name := range files {
		// Of the packages' documentation only the copyright files stay
		// (and the directories that hold them).
		kept := strings.HasSuffix(name, "/copyright") || strings.HasSuffix(name, "/") || name == "usr/share/doc/libgcc-s1"
		if (strings.HasPrefix(name, "usr/share/doc/") && !kept) || strings.HasPrefix(name, "dev/") {
			t.Errorf("the image has %s", name)
		}
	}

	spec := testSpec(t)
	delete(spec.Programs, "mpsctl")
	if _, err := Image(spec); err == nil {
		t.Error("an image without mpsctl was made")
	}
}

// TestWriteArchive: the archive is an OCI layout whose index names the
// image (both annotations) and a docker-archive manifest.json beside it,
// every blob is there under its digest, its entries are sorted and
// dated, and writing it again gives the same bytes.
func TestWriteArchive(t *testing.T) {
	img, err := Image(testSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if err := WriteArchive(&a, img, "v1.2.0+deb1", created); err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(&b, img, "v1.2.0+deb1", created); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same image written twice gives other bytes")
	}
	files := map[string][]byte{}
	var names []string
	tr := tar.NewReader(&a)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(created) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		names = append(names, h.Name)
		files[h.Name], _ = io.ReadAll(tr)
	}
	if !slices.IsSorted(names) {
		t.Errorf("archive entries not sorted: %v", names)
	}
	for name, body := range files {
		if hexSum, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && hexSum != "" {
			sum := sha256.Sum256(body)
			if hex.EncodeToString(sum[:]) != hexSum {
				t.Errorf("blob %s holds content of digest %x", name, sum)
			}
		}
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	digest, _ := img.Digest()
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s", files["index.json"])
	}
	m := index.Manifests[0]
	if m.Digest != digest || m.Annotations[AnnotationRefName] != "v1.2.0-deb1" || m.Annotations[AnnotationImageName] != "docker.io/library/mpsd:v1.2.0-deb1" {
		t.Errorf("index.json's manifest %+v; want digest %s named mpsd:v1.2.0-deb1", m, digest)
	}
	if _, ok := files[blobPath(digest)]; !ok {
		t.Errorf("no manifest blob %s", blobPath(digest))
	}
	var dm []dockerManifest
	if err := json.Unmarshal(files["manifest.json"], &dm); err != nil || len(dm) != 1 || !slices.Equal(dm[0].RepoTags, []string{"mpsd:v1.2.0-deb1"}) || len(dm[0].Layers) != 2 {
		t.Fatalf("manifest.json: %s, %v", files["manifest.json"], err)
	}
	for _, p := range append([]string{dm[0].Config}, dm[0].Layers...) {
		if _, ok := files[p]; !ok {
			t.Errorf("manifest.json names %s, which the archive lacks", p)
		}
	}
	// Layers are gzip with no name and no time in their header.
	zr, err := gzip.NewReader(bytes.NewReader(files[dm[0].Layers[1]]))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("layer gzip header: name %q mtime %v", zr.Name, zr.ModTime)
	}
}

func TestStatusEntry(t *testing.T) {
	for _, tc := range []struct{ name, control, file, want string }{
		{"status added after Package", "Package: libc6\nSource: glibc\nVersion: 2.36-9+deb12u14\nArchitecture: amd64\nDescription: GNU C Library\n shared libraries\n",
			"var/lib/dpkg/status.d/libc6",
			"Package: libc6\nStatus: install ok installed\nSource: glibc\nVersion: 2.36-9+deb12u14\nArchitecture: amd64\nDescription: GNU C Library\n shared libraries\n"},
		{"status kept, no final newline", "Package: gcc-12-base\nStatus: install ok installed\nVersion: 12.2.0-14\nArchitecture: amd64",
			"var/lib/dpkg/status.d/gcc-12-base",
			"Package: gcc-12-base\nStatus: install ok installed\nVersion: 12.2.0-14\nArchitecture: amd64\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := StatusEntry([]byte(tc.control))
			if err != nil || e.Name != tc.file || string(e.Body) != tc.want || e.Type != tar.TypeReg || e.Mode != 0o644 {
				t.Errorf("StatusEntry = %s %q (type %c mode %o), %v; want %s %q", e.Name, e.Body, e.Type, e.Mode, err, tc.file, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, control string }{
		{"empty", ""},
		{"no version", "Package: libc6\nArchitecture: amd64\n"},
		{"no architecture", "Package: libc6\nVersion: 1\n"},
		{"a path as name", "Package: ../etc\nVersion: 1\nArchitecture: amd64\n"},
		{"two paragraphs", "Package: libc6\nVersion: 1\nArchitecture: amd64\n\nPackage: x\n"},
		{"not a field", "Package: libc6\nVersion: 1\nArchitecture: amd64\nnonsense\n"},
		{"a field twice", "Package: libc6\nVersion: 1\nVersion: 2\nArchitecture: amd64\n"},
		{"continuation first", " x\nPackage: libc6\nVersion: 1\nArchitecture: amd64\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e, err := StatusEntry([]byte(tc.control)); !errors.Is(err, ErrControl) {
				t.Errorf("StatusEntry = %s, %v; want ErrControl", e.Name, err)
			}
		})
	}
}

func FuzzStatusEntry(f *testing.F) {
	f.Add([]byte("Package: libc6\nVersion: 2.36-9\nArchitecture: amd64\n"))
	f.Add([]byte("Package: a\nStatus: x\nVersion: 1\nArchitecture: all\nDescription: x\n y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := StatusEntry(b)
		if err != nil {
			return
		}
		name, ok := strings.CutPrefix(e.Name, StatusDir+"/")
		if !ok || strings.Contains(name, "/") || name == ".." || !bytes.HasSuffix(e.Body, []byte("\n")) || !bytes.Contains(e.Body, []byte("\nStatus:")) && !bytes.HasPrefix(e.Body, []byte("Status:")) {
			t.Errorf("StatusEntry(%q) = %s %q", b, e.Name, e.Body)
		}
		// A layer holds it.
		if _, err := Layer([]Entry{e}, created); err != nil {
			t.Errorf("Layer of %s: %v", e.Name, err)
		}
	})
}
