package ociimage

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations naming the image in the archive's index.json: the OCI
// one holds the tag (as the image layout spec and `docker save` write
// it), containerd's the full reference, which `ctr images import` names
// the image by (given the OCI one alone, containerd 1.6 names it
// import-<date>:<tag>).
const (
	AnnotationRefName   = "org.opencontainers.image.ref.name"
	AnnotationImageName = "io.containerd.image.name"
)

// ociLayout is the OCI image layout's version file.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// dockerManifest is one image of a docker-archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteArchive writes img, tagged Ref(version), as one tar holding an OCI
// image layout (oci-layout, index.json, blobs/sha256/) and beside it a
// docker-archive manifest.json naming the same blobs, as `docker save`
// writes since Docker 25: containerd's importer (ctr images import,
// including Debian 12's containerd 1.6) and docker load both take it.
// Its entries are sorted, root's, mode 0644 and dated mtime: the same
// image gives the same bytes.
func WriteArchive(w io.Writer, img v1.Image, version string, mtime time.Time) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("ociimage: the manifest: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("ociimage: the manifest's digest: %w", err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("ociimage: the config: %w", err)
	}
	configName, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("ociimage: the config's digest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return fmt.Errorf("ociimage: the manifest's media type: %w", err)
	}
	files := map[string][]byte{
		"oci-layout":         []byte(ociLayout),
		blobPath(digest):     manifest,
		blobPath(configName): config,
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("ociimage: the layers: %w", err)
	}
	dm := dockerManifest{Config: blobPath(configName), RepoTags: []string{Ref(version)}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("ociimage: a layer's digest: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("ociimage: layer %s: %w", d, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("ociimage: layer %s: %w", d, err)
		}
		files[blobPath(d)] = b
		dm.Layers = append(dm.Layers, blobPath(d))
	}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt,
			Digest:    digest,
			Size:      int64(len(manifest)),
			Annotations: map[string]string{
				AnnotationRefName:   Tag(version),
				AnnotationImageName: FullName(version),
			},
		}},
	}
	if files["index.json"], err = json.Marshal(index); err != nil {
		return fmt.Errorf("ociimage: index.json: %w", err)
	}
	if files["manifest.json"], err = json.Marshal([]dockerManifest{dm}); err != nil {
		return fmt.Errorf("ociimage: manifest.json: %w", err)
	}

	tw := tar.NewWriter(w)
	mtime = mtime.UTC().Truncate(time.Second)
	dirs := []string{"blobs/", "blobs/sha256/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("ociimage: write %s: %w", d, err)
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		b := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("ociimage: write %s: %w", name, err)
		}
		if _, err := tw.Write(b); err != nil {
			return fmt.Errorf("ociimage: write %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("ociimage: close the archive: %w", err)
	}
	return nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
