package helmchart

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/mpsd/mpsd/internal/ociimage"
)

// chartDir is the chart, from this package's directory.
const chartDir = "../../deploy/helm/mpsd"

func TestChartVersion(t *testing.T) {
	for _, tc := range []struct{ name, stamped, want string }{
		{"tag", "v1.2.0", "1.2.0"},
		{"tag without v", "1.2.0", "1.2.0"},
		{"commits after a tag", "v1.2.0-12-gabc1234abc12", "1.2.0+12.gabc1234abc12"},
		{"dirty tag", "v1.2.0-dirty", "1.2.0+dirty"},
		{"dirty commits after a tag", "v1.2.0-12-gabc1234abc12-dirty", "1.2.0+12.gabc1234abc12.dirty"},
		{"prerelease", "v1.2.0-rc.1", "1.2.0-rc.1"},
		{"commits after a prerelease", "v1.2.0-rc.1-3-g0123abcd0123", "1.2.0-rc.1+3.g0123abcd0123"},
		{"bare commit", "abc1234abc12", "0.0.0+git.abc1234abc12"},
		{"dirty bare commit", "abc1234abc12-dirty", "0.0.0+git.abc1234abc12.dirty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := ChartVersion(tc.stamped); err != nil || got != tc.want {
				t.Errorf("ChartVersion(%q) = %q, %v; want %q", tc.stamped, got, err, tc.want)
			}
		})
	}
}

func TestChartVersionRefused(t *testing.T) {
	for _, tc := range []struct{ name, stamped string }{
		{"empty", ""},
		{"devel", "(devel)"},
		{"not SemVer", "vnext"},
		{"two parts", "v1.2"},
		{"leading zero", "v01.2.0"},
		{"git's default abbreviation", "v1.2.0-12-gabc1234"},
		{"bare commit, git's default abbreviation", "abc1234"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := ChartVersion(tc.stamped); !errors.Is(err, ErrVersion) {
				t.Errorf("ChartVersion(%q) = %q, %v; want ErrVersion", tc.stamped, got, err)
			}
		})
	}
}

// defaultImage renders the chart c with its default values, as helm
// install does for a release mpsd in namespace mpsd, and returns the
// DaemonSet's image.
func defaultImage(t *testing.T, c *chart.Chart) string {
	t.Helper()
	kv, err := common.ParseKubeVersion("v1.37.0")
	if err != nil {
		t.Fatal(err)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	top, err := util.ToRenderValues(c, nil, common.ReleaseOptions{Name: "mpsd", Namespace: "mpsd", Revision: 1, IsInstall: true}, caps)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(c, top)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(out["mpsd/templates/daemonset.yaml"]), &ds); err != nil {
		t.Fatal(err)
	}
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the DaemonSet has %d containers, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	return ds.Spec.Template.Spec.Containers[0].Image
}

// TestPackage packages the chart twice for one stamp: the same bytes,
// named by the chart version; loaded back, its version and appVersion
// are the stamp's and its default image is the one make package-image
// tags from that stamp; another commit time changes the bytes.
func TestPackage(t *testing.T) {
	stamp := ociimage.Stamp{Version: "v1.2.0-3-g0123456789ab-dirty", Commit: "0123456789abcdef0123456789abcdef01234567",
		Time: time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)}
	a, err := Package(chartDir, t.TempDir(), stamp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Package(chartDir, t.TempDir(), stamp)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(a) != "mpsd-1.2.0+3.g0123456789ab.dirty.tgz" {
		t.Errorf("packaged as %s; want mpsd-<ChartVersion>.tgz", filepath.Base(a))
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if len(ba) == 0 || !bytes.Equal(ba, bb) {
		t.Errorf("two packages of one chart and stamp differ (%d and %d bytes)", len(ba), len(bb))
	}
	later := stamp
	later.Time = later.Time.Add(time.Second)
	c, err := Package(chartDir, t.TempDir(), later)
	if err != nil {
		t.Fatal(err)
	}
	if bc, _ := os.ReadFile(c); bytes.Equal(ba, bc) {
		t.Errorf("another commit time left the package's bytes as they were")
	}
	ch, err := loader.Load(a)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "1.2.0+3.g0123456789ab.dirty" || ch.Metadata.AppVersion != "v1.2.0-3-g0123456789ab-dirty" {
		t.Errorf("version %q appVersion %q; want the stamp's", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	if img, want := defaultImage(t, ch), ociimage.Ref(stamp.Version); img != want {
		t.Errorf("the packaged chart's default image is %s; want make package-image's %s", img, want)
	}
	for _, f := range ch.Templates {
		if f.ModTime.IsZero() || !f.ModTime.Equal(stamp.Time) {
			t.Errorf("%s dated %v; want the commit's time %v", f.Name, f.ModTime, stamp.Time)
		}
	}
}

// archiveName is the image name an image archive's index.json gives
// containerd (io.containerd.image.name).
func archiveName(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s: no index.json", path)
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct{ Annotations map[string]string }
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("%s: index.json: %v; want one image", path, err)
		}
		return index.Manifests[0].Annotations["io.containerd.image.name"]
	}
}

// TestDistChart loads make package-chart's chart from $MPSD_DIST_DIR and
// renders it with its defaults: the DaemonSet's image is the image make
// package-image wrote there, as containerd names it once imported.
func TestDistChart(t *testing.T) {
	dist := os.Getenv("MPSD_DIST_DIR")
	charts, _ := filepath.Glob(filepath.Join(dist, "mpsd-*.tgz"))
	archive := filepath.Join(dist, "mpsd-image.tar")
	if _, err := os.Stat(archive); dist == "" || err != nil || len(charts) != 1 {
		msg := "no packaged chart and image archive in $MPSD_DIST_DIR (make package-chart package-image; make test does)"
		if os.Getenv("MPSD_REQUIRE_IMAGE") == "1" {
			t.Fatalf("%s (MPSD_REQUIRE_IMAGE=1; found charts %v)", msg, charts)
		}
		t.Skip(msg)
	}
	ch, err := loader.Load(charts[0])
	if err != nil {
		t.Fatal(err)
	}
	img, name := defaultImage(t, ch), archiveName(t, archive)
	if "docker.io/library/"+img != name {
		t.Errorf("%s's default image is %s; %s holds %s: run make package-chart package-image again", charts[0], img, archive, name)
	}
}
