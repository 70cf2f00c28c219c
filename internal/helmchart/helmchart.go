package helmchart

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"

	"github.com/mpsd/mpsd/internal/ociimage"
)

// ErrVersion: the stamped version cannot be made a chart version.
var ErrVersion = errors.New("helmchart: no chart version for the stamped version")

// abbrevLen is hack/ldflags.sh's --abbrev: the commit's hex digits.
const abbrevLen = 12

// describeRe splits `git describe --tags --always --dirty --abbrev=12`:
// a tag with an optional -N-gHASH suffix, or a bare commit; either with
// -dirty.
var (
	describeRe = regexp.MustCompile(`^(.+?)(?:-([0-9]+)-g([0-9a-f]{4,40}))?(-dirty)?$`)
	hashRe     = regexp.MustCompile(`^[0-9a-f]{4,40}$`)
)

// ChartVersion maps the version make build stamps (hack/ldflags.sh: git
// describe) to the chart's SemVer, which Helm requires:
//
//	v1.2.0                       1.2.0
//	v1.2.0-12-gabc1234abc12      1.2.0+12.gabc1234abc12   (build metadata)
//	v1.2.0-rc.1                  1.2.0-rc.1
//	v1.2.0-rc.1-3-gabc1234abc12  1.2.0-rc.1+3.gabc1234abc12
//	v1.2.0-dirty                 1.2.0+dirty
//	abc1234abc12 (no tag yet)    0.0.0+git.abc1234abc12
//
// A commit abbreviated to fewer than 12 hex digits, or a tag that is not
// SemVer once its "v" is gone, is an ErrVersion.
func ChartVersion(stamped string) (string, error) {
	m := describeRe.FindStringSubmatch(stamped)
	if m == nil {
		return "", fmt.Errorf("%w: %q", ErrVersion, stamped)
	}
	tag, count, hash, dirty := m[1], m[2], m[3], m[4] != ""
	var v string
	var build []string
	if count == "" && hashRe.MatchString(tag) && !strings.HasPrefix(tag, "v") {
		v, hash = "0.0.0", tag
		build = append(build, "git", tag)
	} else {
		v = strings.TrimPrefix(tag, "v")
		if count != "" {
			build = append(build, count, "g"+hash)
		}
	}
	if hash != "" && len(hash) < abbrevLen {
		return "", fmt.Errorf("%w: %q abbreviates the commit to fewer than %d hex digits (hack/ldflags.sh: git describe --abbrev=%d)", ErrVersion, stamped, abbrevLen, abbrevLen)
	}
	if dirty {
		build = append(build, "dirty")
	}
	if len(build) > 0 {
		v += "+" + strings.Join(build, ".")
	}
	if _, err := semver.StrictNewVersion(v); err != nil {
		return "", fmt.Errorf("%w: %q gives %q: %v", ErrVersion, stamped, v, err)
	}
	return v, nil
}

// Load reads the chart at dir with Helm's loader and stamps it: version
// ChartVersion(stamp.Version), appVersion ociimage.Tag(stamp.Version) (the
// default image.tag, so the default image is make package-image's), and
// every file's time stamp.Time.
func Load(dir string, stamp ociimage.Stamp) (*chart.Chart, error) {
	version, err := ChartVersion(stamp.Version)
	if err != nil {
		return nil, err
	}
	c, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("helmchart: load %s: %w", dir, err)
	}
	if len(c.Dependencies()) > 0 {
		return nil, fmt.Errorf("helmchart: %s has dependencies, which Load does not stamp", dir)
	}
	c.Metadata.Version = version
	c.Metadata.AppVersion = ociimage.Tag(stamp.Version)
	t := stamp.Time.UTC()
	c.ModTime, c.SchemaModTime = t, t
	for _, files := range [][]*common.File{c.Raw, c.Templates, c.Files} {
		for _, f := range files {
			f.ModTime = t
		}
	}
	if c.Lock != nil {
		c.Lock.Generated = t
	}
	return c, nil
}

// Package writes Load(dir, stamp)'s chart into outDir as Helm's
// <name>-<version>.tgz, through a temporary file, and returns its path.
// The same chart and stamp give the same bytes.
func Package(dir, outDir string, stamp ociimage.Stamp) (string, error) {
	if stamp.Time.IsZero() {
		return "", fmt.Errorf("helmchart: no commit time to date the chart's files with")
	}
	c, err := Load(dir, stamp)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(outDir, ".mkchart-*")
	if err != nil {
		return "", fmt.Errorf("helmchart: %w", err)
	}
	defer os.RemoveAll(tmp)
	p, err := chartutil.Save(c, tmp)
	if err != nil {
		return "", fmt.Errorf("helmchart: save %s: %w", dir, err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		return "", fmt.Errorf("helmchart: %w", err)
	}
	out := filepath.Join(outDir, filepath.Base(p))
	if err := os.Rename(p, out); err != nil {
		return "", fmt.Errorf("helmchart: %w", err)
	}
	return out, nil
}
