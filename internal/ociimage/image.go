package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entrypoint is the image's entrypoint: mpsd, its arguments the pod's.
const Entrypoint = "/usr/bin/mpsd"

// Programs are the image's programs: each name's file goes to /usr/bin.
var Programs = []string{"mpsd", "mpsctl", "mps-launch"}

// Spec is what an image is made of. Two builds of one Spec give the same
// bytes.
type Spec struct {
	// Version is what hack/ldflags.sh stamps into the programs (git
	// describe); the image is tagged Ref(Version).
	Version string
	// Revision is the commit the programs were built from.
	Revision string
	// Created is the commit's time (SOURCE_DATE_EPOCH): every file's
	// mtime, the config's and the history's created time.
	Created time.Time
	// Arch is the programs' and packages' architecture (GOARCH: amd64).
	Arch string
	// Base is the user space: the Debian packages' data (ReadTar), in
	// the order given; BaseFiles adds the files that make it a system.
	Base []Entry
	// Programs are the programs' bodies by name (Programs' names).
	Programs map[string][]byte
}

// BaseFiles are the files of the image's user space that no package
// brings: root in passwd and group (os/user resolves the config's users
// with the C library, which reads them through nsswitch.conf's files),
// the directories mpsd's default config names, and /tmp.
func BaseFiles() []Entry {
	file := func(name, body string) Entry {
		return Entry{Name: name, Type: tar.TypeReg, Mode: 0o644, Body: []byte(body)}
	}
	dir := func(name string, mode int64) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: mode} }
	return []Entry{
		file("etc/passwd", "root:x:0:0:root:/root:/usr/sbin/nologin\n"),
		file("etc/group", "root:x:0:\n"),
		file("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
		dir("etc/mpsd", 0o755),
		dir("root", 0o700),
		dir("run", 0o755),
		dir("tmp", 0o1777),
		dir("var/lib/mpsd", 0o755),
		dir("var/log/mpsd", 0o755),
	}
}

// Image assembles spec's image: an OCI manifest with two gzip layers
// (the user space, then the programs at /usr/bin) and a config with
// Entrypoint, a PATH, and the OCI labels of version, revision and
// creation time.
func Image(spec Spec) (v1.Image, error) {
	if spec.Arch == "" {
		return nil, fmt.Errorf("ociimage: no architecture")
	}
	base, err := Layer(append(append([]Entry(nil), spec.Base...), BaseFiles()...), spec.Created)
	if err != nil {
		return nil, fmt.Errorf("ociimage: the user space's layer: %w", err)
	}
	var progs []Entry
	for _, name := range Programs {
		body, ok := spec.Programs[name]
		if !ok {
			return nil, fmt.Errorf("ociimage: no %s among the programs", name)
		}
		progs = append(progs, Entry{Name: "usr/bin/" + name, Type: tar.TypeReg, Mode: 0o755, Body: body})
	}
	bin, err := Layer(progs, spec.Created)
	if err != nil {
		return nil, fmt.Errorf("ociimage: the programs' layer: %w", err)
	}
	created := v1.Time{Time: spec.Created.UTC().Truncate(time.Second)}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range []struct {
		tar []byte
		by  string
	}{
		{base, "ociimage: Debian packages' data, passwd, group"},
		{bin, "ociimage: /usr/bin/mpsd, mpsctl, mps-launch"},
	} {
		layer, err := gzipLayer(l.tar)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: l.by}})
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("ociimage: append the layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ociimage: read the config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = spec.Arch, "linux", created
	cf.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "mpsd",
			"org.opencontainers.image.version":  spec.Version,
			"org.opencontainers.image.revision": spec.Revision,
			"org.opencontainers.image.created":  created.Format(time.RFC3339),
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("ociimage: set the config: %w", err)
	}
	return img, nil
}

// gzipLayer is the layer of the uncompressed tar b, compressed by
// compress/gzip (no name, no time in its header: the same b gives the
// same blob).
func gzipLayer(b []byte) (v1.Layer, error) {
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("ociimage: compress a layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: compress a layer: %w", err)
	}
	compressed := gz.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("ociimage: a layer: %w", err)
	}
	return layer, nil
}
