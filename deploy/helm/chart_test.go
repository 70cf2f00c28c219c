package helm

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/mpsd/mpsd/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ and the chart's copies of examples/")

const (
	// chartDir is the chart, relative to this package.
	chartDir = "mpsd"
	// release and namespace are those of the install docs/cluster.md shows:
	// helm install mpsd deploy/helm/mpsd -n mpsd --create-namespace.
	release   = "mpsd"
	namespace = "mpsd"
	// kubeVersion is the cluster the chart is rendered for.
	kubeVersion = "v1.37.0"
	// exampleFile is the DaemonSet the default render must equal.
	exampleFile = "../../examples/kubernetes/mpsd-daemonset.yaml"
	// regen is how the files -update writes are regenerated.
	regen = "go test ./deploy/helm -run 'TestDefaultRender|TestChartCopiesExamples' -update"
)

// copies maps each file the chart carries from examples/ (chart path) to
// its source: the chart is self-contained, as helm package and a chart
// repository need.
var copies = map[string]string{
	"mpsd/files/mpsd-alerts.yml": "../../examples/prometheus/mpsd-alerts.yml",
	"mpsd/files/mpsd.json":       "../../examples/grafana/mpsd.json",
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return ch
}

func capabilities(t *testing.T) *common.Capabilities {
	t.Helper()
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	return caps
}

// values parses a values file's text, as helm install -f reads it.
func values(t *testing.T, text string) map[string]any {
	t.Helper()
	v, err := common.ReadValues([]byte(text))
	if err != nil {
		t.Fatalf("values %q: %v", text, err)
	}
	return v
}

// render renders the chart with vals over its values.yaml as helm install
// mpsd deploy/helm/mpsd -n mpsd does: the values checked against
// values.schema.json, then the templates. It returns the manifests by
// template name, without NOTES.txt, and NOTES.txt apart.
func render(t *testing.T, vals map[string]any) (manifests map[string]string, notes string, err error) {
	t.Helper()
	return renderRelease(t, common.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, vals)
}

// renderRelease is render for another release.
func renderRelease(t *testing.T, rel common.ReleaseOptions, vals map[string]any) (manifests map[string]string, notes string, err error) {
	t.Helper()
	ch := loadChart(t)
	top, err := util.ToRenderValues(ch, vals, rel, capabilities(t))
	if err != nil {
		return nil, "", err
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		return nil, "", err
	}
	manifests = map[string]string{}
	for name, text := range out {
		if path.Base(name) == "NOTES.txt" {
			notes = text
			continue
		}
		manifests[name] = text
	}
	return manifests, notes, nil
}

// mustRender is render that fails the test on an error.
func mustRender(t *testing.T, vals map[string]any) (map[string]string, string) {
	t.Helper()
	m, notes, err := render(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return m, notes
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule: the fields
// its CRD defines for what the chart sets, so that strict decoding refuses
// any other.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Alert       string            `json:"alert,omitempty"`
				Record      string            `json:"record,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// serviceMonitor is monitoring.coreos.com/v1 ServiceMonitor, as
// prometheusRule is PrometheusRule.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// object is one decoded document.
type object struct {
	kind, namespace, name string
	obj                   any
}

// objects are the documents of a render or a file, in order.
type objects []object

// get returns the object of that kind and name, or nil.
func (o objects) get(kind, name string) any {
	for _, x := range o {
		if x.kind == kind && x.name == name {
			return x.obj
		}
	}
	return nil
}

// kinds returns each object's kind/name, sorted.
func (o objects) kinds() []string {
	var ks []string
	for _, x := range o {
		ks = append(ks, x.kind+"/"+x.name)
	}
	slices.Sort(ks)
	return ks
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decode reads the YAML documents of each source strictly: a known
// apiVersion and kind, no unknown or repeated fields, valid names. It
// returns the problems found, each naming its source and document.
func decode(srcs map[string]string) (objects, []string) {
	var o objects
	var problems []string
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, src := range names {
		for i, doc := range docSep.Split(srcs[src], -1) {
			where := fmt.Sprintf("%s document %d", src, i+1)
			if isEmpty(doc) {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				obj = &corev1.Namespace{}
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "v1 Service":
				obj = &corev1.Service{}
			case "v1 ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "apps/v1 DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "monitoring.coreos.com/v1 PrometheusRule":
				obj = &prometheusRule{}
			case "monitoring.coreos.com/v1 ServiceMonitor":
				obj = &serviceMonitor{}
			default:
				problems = append(problems, fmt.Sprintf("%s: apiVersion %q kind %q: not a type the chart makes", where, tm.APIVersion, tm.Kind))
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			var meta metav1.ObjectMeta
			if m, ok := obj.(interface{ GetObjectMeta() metav1.Object }); ok {
				meta.Name, meta.Namespace = m.GetObjectMeta().GetName(), m.GetObjectMeta().GetNamespace()
			} else {
				switch v := obj.(type) {
				case *prometheusRule:
					meta = v.ObjectMeta
				case *serviceMonitor:
					meta = v.ObjectMeta
				}
			}
			for _, msg := range validation.IsDNS1123Subdomain(meta.Name) {
				problems = append(problems, fmt.Sprintf("%s: metadata.name %q: %s", where, meta.Name, msg))
			}
			if meta.Namespace != "" {
				for _, msg := range validation.IsDNS1123Label(meta.Namespace) {
					problems = append(problems, fmt.Sprintf("%s: metadata.namespace %q: %s", where, meta.Namespace, msg))
				}
			}
			o = append(o, object{kind: tm.Kind, namespace: meta.Namespace, name: meta.Name, obj: obj})
		}
	}
	return o, problems
}

// isEmpty reports whether a document has nothing but comments and blanks.
func isEmpty(doc string) bool {
	for l := range strings.Lines(doc) {
		if l := strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// mustDecode is decode that fails the test on a problem.
func mustDecode(t *testing.T, srcs map[string]string) objects {
	t.Helper()
	o, problems := decode(srcs)
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.FailNow()
	}
	return o
}

// h100s is the host configs are checked against: 8 H100 80GB as NVML
// reports them (examples/kubernetes checks its config on the same).
func h100s() []policy.GPU {
	gpus := make([]policy.GPU, 8)
	for i := range gpus {
		gpus[i] = policy.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i), Memory: 85520809984}
	}
	return gpus
}

// users knows root and the users of nonDefaultValues.
type users struct{}

func (users) UserID(name string) (uint32, error) {
	switch name {
	case "root":
		return 0, nil
	case "alice":
		return 1001, nil
	}
	return 0, fmt.Errorf("no user %q", name)
}

func (users) GroupID(name string) (uint32, error) { return 0, fmt.Errorf("no group %q", name) }

// daemonSetConfig finds the rendered DaemonSet's mpsd container and the
// config it runs with, parses that config with mpsd's own loader, and
// checks that the DaemonSet can run it: its volumes have names of their
// own that Kubernetes accepts, no two mounts share a path, --config is a
// key of a mounted ConfigMap, run_dir, state_dir, log_dir and the socket's
// directory are mounted from the host at their paths (run_dir with
// HostToContainer propagation), the host's /etc/passwd and /etc/group
// are bound read-only over the image's (the config's users and groups
// resolve through them), and the readiness probe's port is
// metrics.listen's.
func daemonSetConfig(t *testing.T, o objects) (*appsv1.DaemonSet, *policy.Config) {
	t.Helper()
	ds, _ := o.get("DaemonSet", "mpsd").(*appsv1.DaemonSet)
	if ds == nil {
		t.Fatalf("no DaemonSet mpsd among %v", o.kinds())
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet mpsd has %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Errorf("DaemonSet mpsd: two volumes named %s", v.Name)
		}
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			t.Errorf("DaemonSet mpsd: volume name %q: %s", v.Name, msg)
		}
		vols[v.Name] = v
	}
	hostMounts := map[string]string{}
	propagation := map[string]corev1.MountPropagationMode{}
	mountedAt := map[string]string{} // mount path -> volume
	var cfgPath, cfgMap string
	for _, m := range c.VolumeMounts {
		if other, dup := mountedAt[m.MountPath]; dup {
			t.Errorf("container mpsd: volumes %s and %s both mounted at %s", other, m.Name, m.MountPath)
		}
		mountedAt[m.MountPath] = m.Name
		v, ok := vols[m.Name]
		switch {
		case !ok:
			t.Errorf("container mpsd mounts volume %s, which is not in spec.volumes", m.Name)
		case v.HostPath != nil:
			hostMounts[m.MountPath] = v.HostPath.Path
			if (m.MountPath == "/etc/passwd" || m.MountPath == "/etc/group") && (!m.ReadOnly || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathFile) {
				t.Errorf("container mpsd: %s is bound from the host without readOnly and hostPath type File", m.MountPath)
			}
		case v.ConfigMap != nil:
			cfgPath, cfgMap = m.MountPath, v.ConfigMap.Name
		}
		if m.MountPropagation != nil {
			propagation[m.MountPath] = *m.MountPropagation
		}
	}
	var cfgFile string
	for _, a := range c.Command {
		if f, ok := strings.CutPrefix(a, "--config="); ok {
			cfgFile = f
		}
	}
	cm, _ := o.get("ConfigMap", cfgMap).(*corev1.ConfigMap)
	if cfgFile == "" || cm == nil || path.Dir(cfgFile) != cfgPath || cm.Data[path.Base(cfgFile)] == "" {
		t.Fatalf("container mpsd: --config %q is not a key of a mounted ConfigMap (mounted: %q at %s)", cfgFile, cfgMap, cfgPath)
	}
	cfg, err := policy.Parse(strings.NewReader(cm.Data[path.Base(cfgFile)]), policy.Host{GPUs: h100s(), Users: users{}})
	if err != nil {
		t.Fatalf("ConfigMap %s: mpsd refuses its config: %v", cm.Name, err)
	}
	for _, dir := range []string{cfg.RunDir, cfg.StateDir, cfg.LogDir, path.Dir(cfg.Socket)} {
		if hostMounts[dir] != dir {
			t.Errorf("container mpsd: %s is not mounted from the host's %s (host mounts %v)", dir, dir, hostMounts)
		}
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if hostMounts[f] != f {
			t.Errorf("container mpsd: the host's %s is not mounted at %s: the config's users and groups would not resolve (the image's lists only root)", f, f)
		}
	}
	if p := propagation[cfg.RunDir]; p != corev1.MountPropagationHostToContainer {
		t.Errorf("container mpsd: run_dir %s is mounted with propagation %q, want HostToContainer", cfg.RunDir, p)
	}
	_, port, _ := strings.Cut(cfg.Metrics.Listen, ":")
	if len(c.Ports) != 1 || fmt.Sprint(c.Ports[0].ContainerPort) != port[strings.LastIndex(port, ":")+1:] {
		t.Errorf("container mpsd: ports %v, want the metrics port of metrics.listen %s", c.Ports, cfg.Metrics.Listen)
	}
	return ds, cfg
}

// joined is the render as helm template prints it: each template's output
// under a "# Source:" line, by template name.
func joined(manifests map[string]string, notes string) string {
	names := make([]string, 0, len(manifests))
	for n := range manifests {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		if isEmpty(manifests[n]) {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, strings.Trim(manifests[n], "\n"))
	}
	fmt.Fprintf(&b, "# NOTES.txt:\n%s\n", strings.TrimRight(notes, "\n"))
	return b.String()
}

// checkGolden compares got with the golden file, or rewrites it with
// -update.
func checkGolden(t *testing.T, file, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (regenerate: %s)", err, regen)
	}
	if got != string(want) {
		t.Errorf("%s differs from the render:\n%s\nregenerate: %s", file, lineDiff(string(want), got), regen)
	}
}

// lineDiff shows the lines only in want (-) and only in got (+), at most
// 40 of them.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	n := 0
	for i := 0; i < max(len(w), len(g)) && n < 40; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n-%s\n+%s\n", i+1, wl, gl)
			n++
		}
	}
	return b.String()
}

// TestDefaultRender keeps testdata/default.yaml what the chart renders
// with its default values, every object of it decoding strictly, and its
// config valid for mpsd and mounted as mpsd needs.
func TestDefaultRender(t *testing.T) {
	m, notes := mustRender(t, nil)
	o := mustDecode(t, m)
	daemonSetConfig(t, o)
	want := []string{"ClusterRole/mpsd-pod-reader.mpsd", "ClusterRoleBinding/mpsd-pod-reader.mpsd", "ConfigMap/mpsd-config", "DaemonSet/mpsd", "ServiceAccount/mpsd"}
	if got := o.kinds(); !slices.Equal(got, want) {
		t.Errorf("default render: objects %v, want %v (the optional ones off)", got, want)
	}
	if !strings.Contains(notes, "mpsd.io/inference-sm") {
		t.Errorf("NOTES.txt does not name the group's resource mpsd.io/inference-sm:\n%s", notes)
	}
	checkGolden(t, filepath.Join("testdata", "default.yaml"), joined(m, notes))
}

// asYAML marshals v for comparison and messages.
func asYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// chartNames are the names the chart gives to what the example names
// otherwise, by the example's kind/name: the chart's cluster-scoped
// objects carry the release's namespace (two releases of one name in two
// namespaces must not claim the same ones), and it mounts the CRI
// socket's directory as volume cri-socket whatever that directory is
// called (cri-dockerd's /run would clash with run_dir's volume "run").
var chartNames = map[string]string{
	"ClusterRole/mpsd-pod-reader":        "mpsd-pod-reader.mpsd",
	"ClusterRoleBinding/mpsd-pod-reader": "mpsd-pod-reader.mpsd",
	"Volume/containerd":                  "cri-socket",
}

// chartName is the chart's name for the example's kind/name.
func chartName(kind, name string) string {
	if n, ok := chartNames[kind+"/"+name]; ok {
		return n
	}
	return name
}

// TestDefaultMatchesExample checks that the default render is
// examples/kubernetes/mpsd-daemonset.yaml, object by object (its
// Namespace aside: helm install --create-namespace makes it): the same
// names (but chartNames'), the example's labels among the chart's, the
// same DaemonSet spec but for the image (the chart's image, its pull
// policy and mpsd's path there, /usr/bin/mpsd), the same RBAC, and a
// ConfigMap whose mpsd.yaml is the example's as data (the chart renders
// values, so without the example's comments), both valid for mpsd.
func TestDefaultMatchesExample(t *testing.T) {
	src, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	example := mustDecode(t, map[string]string{exampleFile: string(src)})
	m, _ := mustRender(t, nil)
	chartObjs := mustDecode(t, m)
	compared := 0
	for _, ex := range example {
		if ex.kind == "Namespace" {
			if ex.name != namespace {
				t.Errorf("the example's namespace is %s; the chart's install uses %s", ex.name, namespace)
			}
			continue
		}
		got := chartObjs.get(ex.kind, chartName(ex.kind, ex.name))
		if got == nil {
			t.Errorf("%s %s of the example: the chart renders none (it renders %v)", ex.kind, ex.name, chartObjs.kinds())
			continue
		}
		compared++
		where := ex.kind + " " + ex.name
		exMeta, gotMeta := metaOf(ex.obj), metaOf(got)
		if exMeta.Namespace != gotMeta.Namespace {
			t.Errorf("%s: namespace %q, the example's %q", where, gotMeta.Namespace, exMeta.Namespace)
		}
		for k, v := range exMeta.Labels {
			if gotMeta.Labels[k] != v {
				t.Errorf("%s: label %s=%q, the example's %q", where, k, gotMeta.Labels[k], v)
			}
		}
		var exBody, gotBody any
		switch e := ex.obj.(type) {
		case *appsv1.DaemonSet:
			g := got.(*appsv1.DaemonSet)
			exSpec, gotSpec := e.Spec.DeepCopy(), g.Spec.DeepCopy()
			for i := range exSpec.Template.Spec.Volumes {
				v := &exSpec.Template.Spec.Volumes[i]
				v.Name = chartName("Volume", v.Name)
			}
			for _, s := range []*appsv1.DaemonSetSpec{exSpec, gotSpec} {
				for i := range s.Template.Spec.Containers {
					c := &s.Template.Spec.Containers[i]
					if len(c.Command) > 0 && path.Base(c.Command[0]) == "mpsd" {
						c.Command[0] = "mpsd"
					}
					c.Image, c.ImagePullPolicy = "", ""
					for j := range c.VolumeMounts {
						m := &c.VolumeMounts[j]
						m.Name = chartName("Volume", m.Name)
					}
				}
			}
			exBody, gotBody = exSpec, gotSpec
		case *corev1.ServiceAccount:
			exBody, gotBody = struct{}{}, struct{}{}
		case *rbacv1.ClusterRole:
			exBody, gotBody = e.Rules, got.(*rbacv1.ClusterRole).Rules
		case *rbacv1.ClusterRoleBinding:
			g := got.(*rbacv1.ClusterRoleBinding)
			ref := e.RoleRef
			ref.Name = chartName(ref.Kind, ref.Name)
			exBody, gotBody = []any{ref, e.Subjects}, []any{g.RoleRef, g.Subjects}
		case *corev1.ConfigMap:
			g := got.(*corev1.ConfigMap)
			exBody, gotBody = parsedData(t, e), parsedData(t, g)
			for _, cm := range []*corev1.ConfigMap{e, g} {
				if _, err := policy.Parse(strings.NewReader(cm.Data["mpsd.yaml"]), policy.Host{GPUs: h100s(), Users: users{}}); err != nil {
					t.Errorf("%s: mpsd refuses its mpsd.yaml: %v", where, err)
				}
			}
		default:
			t.Errorf("%s: the test does not compare this kind", where)
			continue
		}
		if e, g := asYAML(t, exBody), asYAML(t, gotBody); e != g {
			t.Errorf("%s differs from the example's:\n%s", where, lineDiff(e, g))
		}
	}
	if compared != 5 {
		t.Errorf("compared %d objects of the example, want 5 (DaemonSet, ConfigMap, ServiceAccount, ClusterRole, ClusterRoleBinding)", compared)
	}
	ds := chartObjs.get("DaemonSet", "mpsd").(*appsv1.DaemonSet)
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != "mpsd:0.1.0" || c.ImagePullPolicy != corev1.PullIfNotPresent || c.Command[0] != "/usr/bin/mpsd" {
		t.Errorf("image %q pull policy %q command %q; want mpsd:<appVersion> 0.1.0, IfNotPresent, /usr/bin/mpsd (the image's)", c.Image, c.ImagePullPolicy, c.Command[0])
	}
}

// metaOf returns a decoded object's metadata.
func metaOf(obj any) metav1.ObjectMeta {
	switch v := obj.(type) {
	case *corev1.ConfigMap:
		return v.ObjectMeta
	case *corev1.ServiceAccount:
		return v.ObjectMeta
	case *appsv1.DaemonSet:
		return v.ObjectMeta
	case *rbacv1.ClusterRole:
		return v.ObjectMeta
	case *rbacv1.ClusterRoleBinding:
		return v.ObjectMeta
	}
	return metav1.ObjectMeta{}
}

// parsedData is a ConfigMap's data with each YAML value parsed.
func parsedData(t *testing.T, cm *corev1.ConfigMap) map[string]any {
	t.Helper()
	out := map[string]any{}
	for k, v := range cm.Data {
		var x any
		if err := yaml.Unmarshal([]byte(v), &x); err != nil {
			t.Fatalf("ConfigMap %s: %s: %v", cm.Name, k, err)
		}
		out[k] = x
	}
	return out
}

// nonDefaultValues changes mpsd's directories, port and groups, and the
// placement of its pods.
const nonDefaultValues = `
nodeSelector:
  gpu.example.com/mps: "on"
tolerations: []
runtimeClassName: ""
config:
  socket: /run/mps-share/api.sock
  run_dir: /run/mps-share
  state_dir: /var/lib/mps-share
  log_dir: /var/log/mps-share
  metrics:
    listen: 0.0.0.0:19486
  placement: spread
  groups:
    inference: null
    training:
      users: [root, alice]
      gpus: [0, 1, 2, 3]
      sm_percent: 100
      memory: 64G
      max_clients: 16
      multiuser: true
`

// TestValues renders the chart with other values: each render decodes
// strictly and its config is valid for mpsd and mounted as mpsd needs;
// check says what the values changed.
func TestValues(t *testing.T) {
	const base = "https://docs.example.com/mpsd/alerts.md"
	alertsSrc, err := os.ReadFile(copies["mpsd/files/mpsd-alerts.yml"])
	if err != nil {
		t.Fatal(err)
	}
	// anchors are the source rules' runbook anchors, by alert.
	anchors := map[string]string{}
	var src struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(alertsSrc, &src); err != nil {
		t.Fatal(err)
	}
	// srcURLs are the source rules' runbook URLs, by anchor.
	srcURLs := map[string]string{}
	for _, g := range src.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				_, anchors[r.Alert], _ = strings.Cut(r.Annotations["runbook_url"], "#")
				srcURLs[anchors[r.Alert]] = r.Annotations["runbook_url"]
			}
		}
	}
	if len(anchors) == 0 {
		t.Fatal("no alerts in the rules file")
	}
	// checkRules checks that the PrometheusRule has every alert of the
	// rules file, each runbook_url starting with wantBase and keeping its
	// anchor (wantBase "": the rules' own URL).
	checkRules := func(t *testing.T, o objects, wantBase string) {
		pr, _ := o.get("PrometheusRule", "mpsd").(*prometheusRule)
		if pr == nil {
			t.Fatalf("no PrometheusRule mpsd among %v", o.kinds())
		}
		seen := 0
		for _, g := range pr.Spec.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				seen++
				url := r.Annotations["runbook_url"]
				gotBase, anchor, ok := strings.Cut(url, "#")
				switch {
				case !ok || anchor != anchors[r.Alert] || anchor == "":
					t.Errorf("alert %s: runbook_url %q does not keep its anchor #%s", r.Alert, url, anchors[r.Alert])
				case wantBase != "" && gotBase != wantBase:
					t.Errorf("alert %s: runbook_url %q does not start with %s#", r.Alert, url, wantBase)
				case wantBase == "" && !strings.Contains(string(alertsSrc), `runbook_url: "`+url+`"`):
					t.Errorf("alert %s: runbook_url %q is not the rules file's", r.Alert, url)
				}
			}
		}
		if seen != len(anchors) {
			t.Errorf("PrometheusRule has %d alerts, the rules file %d", seen, len(anchors))
		}
		// Everything else is the rules file's, as data: the rendered
		// spec with the source's runbook URLs put back is the file.
		var want, got any
		if err := yaml.Unmarshal(alertsSrc, &want); err != nil {
			t.Fatal(err)
		}
		for _, g := range pr.Spec.Groups {
			for _, r := range g.Rules {
				if u, ok := r.Annotations["runbook_url"]; ok {
					_, anchor, _ := strings.Cut(u, "#")
					r.Annotations["runbook_url"] = srcURLs[anchor]
				}
			}
		}
		if err := yaml.Unmarshal([]byte(asYAML(t, pr.Spec)), &got); err != nil {
			t.Fatal(err)
		}
		if w, g := asYAML(t, want), asYAML(t, got); w != g {
			t.Errorf("PrometheusRule's spec is not the rules file's:\n%s", lineDiff(w, g))
		}
	}
	tests := []struct {
		name   string
		values string
		check  func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config)
	}{
		{"defaults", ``, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			for _, kind := range []string{"PrometheusRule", "ServiceMonitor", "Service"} {
				if slices.ContainsFunc(o, func(x object) bool { return x.kind == kind }) {
					t.Errorf("a %s is rendered by default", kind)
				}
			}
			if o.get("ConfigMap", "mpsd-dashboard") != nil {
				t.Error("the dashboard's ConfigMap is rendered by default")
			}
		}},
		{"optional objects on", `
prometheus:
  rules: {enabled: true, labels: {release: prometheus}}
  serviceMonitor: {enabled: true, labels: {release: prometheus}}
grafana:
  dashboard: {enabled: true, namespace: monitoring}
`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			checkRules(t, o, "")
			if pr := o.get("PrometheusRule", "mpsd").(*prometheusRule); pr.Labels["release"] != "prometheus" {
				t.Errorf("PrometheusRule labels %v, want release=prometheus among them", pr.Labels)
			}
			sm, _ := o.get("ServiceMonitor", "mpsd").(*serviceMonitor)
			svc, _ := o.get("Service", "mpsd-metrics").(*corev1.Service)
			if sm == nil || svc == nil {
				t.Fatalf("ServiceMonitor mpsd and Service mpsd-metrics: got %v", o.kinds())
			}
			// The Service selects the DaemonSet's pods and the
			// ServiceMonitor the Service; the job label is "mpsd", which
			// MpsdDown's up{job=~"mpsd.*"} selects.
			for k, v := range svc.Spec.Selector {
				if ds.Spec.Template.Labels[k] != v {
					t.Errorf("Service selector %v does not select the DaemonSet's pods %v", svc.Spec.Selector, ds.Spec.Template.Labels)
				}
			}
			for k, v := range sm.Spec.Selector.MatchLabels {
				if svc.Labels[k] != v {
					t.Errorf("ServiceMonitor selector %v does not select the Service %v", sm.Spec.Selector.MatchLabels, svc.Labels)
				}
			}
			if job := svc.Labels[sm.Spec.JobLabel]; !strings.HasPrefix(job, "mpsd") {
				t.Errorf("scrape job %q (label %s): MpsdDown selects job=~\"mpsd.*\"", job, sm.Spec.JobLabel)
			}
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
				t.Errorf("Service ports %v, ServiceMonitor endpoints %v: want the pod's metrics port", svc.Spec.Ports, sm.Spec.Endpoints)
			}
			if sm.Labels["release"] != "prometheus" {
				t.Errorf("ServiceMonitor labels %v, want release=prometheus among them", sm.Labels)
			}
			dash, _ := o.get("ConfigMap", "mpsd-dashboard").(*corev1.ConfigMap)
			if dash == nil {
				t.Fatalf("no dashboard ConfigMap among %v", o.kinds())
			}
			want, err := os.ReadFile(copies["mpsd/files/mpsd.json"])
			if err != nil {
				t.Fatal(err)
			}
			if dash.Namespace != "monitoring" || dash.Labels["grafana_dashboard"] != "1" || dash.Data["mpsd.json"] != strings.TrimRight(string(want), "\n") {
				t.Errorf("dashboard ConfigMap: namespace %q, labels %v, mpsd.json of %d bytes; want monitoring, grafana_dashboard=1, examples/grafana/mpsd.json (%d bytes)",
					dash.Namespace, dash.Labels, len(dash.Data["mpsd.json"]), len(want))
			}
		}},
		{"runbookBase", `
prometheus:
  rules: {enabled: true}
  runbookBase: ` + base + `
`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			checkRules(t, o, base)
		}},
		{"nodeSelector", `
nodeSelector:
  gpu.example.com/mps: "on"
`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			// Helm merges maps: the default key stays unless set to null.
			want := map[string]string{"gpu.example.com/mps": "on", "nvidia.com/gpu.present": "true"}
			if got := ds.Spec.Template.Spec.NodeSelector; !equalMaps(got, want) {
				t.Errorf("nodeSelector %v, want %v", got, want)
			}
		}},
		{"image", `
image: {repository: registry.example.com/mpsd, tag: v1.2.0-3-gabcdef0, pullPolicy: Always}
`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			c := ds.Spec.Template.Spec.Containers[0]
			if c.Image != "registry.example.com/mpsd:v1.2.0-3-gabcdef0" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("image %q pull policy %q", c.Image, c.ImagePullPolicy)
			}
		}},
		{"config and placement", nonDefaultValues, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			spec := ds.Spec.Template.Spec
			if want := map[string]string{"gpu.example.com/mps": "on", "nvidia.com/gpu.present": "true"}; !equalMaps(spec.NodeSelector, want) {
				t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, want)
			}
			if len(spec.Tolerations) != 0 || spec.RuntimeClassName != nil {
				t.Errorf("tolerations %v runtimeClassName %v, want none", spec.Tolerations, spec.RuntimeClassName)
			}
			var groups []string
			for _, g := range cfg.Groups {
				groups = append(groups, g.Name)
			}
			if !slices.Equal(groups, []string{"training"}) || cfg.RunDir != "/run/mps-share" || cfg.Metrics.Listen != "0.0.0.0:19486" || cfg.Placement != "spread" {
				t.Errorf("config: groups %v run_dir %s metrics.listen %s placement %s; want the values'", groups, cfg.RunDir, cfg.Metrics.Listen, cfg.Placement)
			}
			if p := spec.Containers[0].ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != "metrics" {
				t.Errorf("readiness probe %v, want /readyz on the metrics port", p)
			}
		}},
		{"CRI-O and more flags", `
kubelet: {cri: /var/run/crio/crio.sock}
extraArgs: [--kubelet-groups=inference]
extraVolumeMounts: [{name: hostshm, mountPath: /dev/shm}]
`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			c := ds.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Command, "--kubelet-cri=/var/run/crio/crio.sock") || c.Command[len(c.Command)-1] != "--kubelet-groups=inference" {
				t.Errorf("command %q", c.Command)
			}
			mounts := map[string]string{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m.Name
			}
			hostPaths := map[string]string{}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			if hostPaths[mounts["/var/run/crio"]] != "/var/run/crio" || hostPaths[mounts["/dev/shm"]] != "/dev/shm" || mounts["/run/containerd"] != "" {
				t.Errorf("mounts %v of volumes %v: want the host's /var/run/crio and /dev/shm, no /run/containerd", mounts, hostPaths)
			}
		}},
		// daemonSetConfig checks the volumes' names: one named after the
		// socket's directory would be "run" here, run_dir's volume's name.
		{"CRI socket in /run", `kubelet: {cri: /run/cri-dockerd.sock}`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			checkCRIMount(t, ds, "/run/cri-dockerd.sock")
		}},
		// ... and here "cri_dockerd.d", which is no volume name.
		{"CRI socket directory named with _ and .", `kubelet: {cri: /var/run/cri_dockerd.d/cri.sock}`, func(t *testing.T, o objects, ds *appsv1.DaemonSet, cfg *policy.Config) {
			checkCRIMount(t, ds, "/var/run/cri_dockerd.d/cri.sock")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := mustRender(t, values(t, tt.values))
			o := mustDecode(t, m)
			ds, cfg := daemonSetConfig(t, o)
			tt.check(t, o, ds, cfg)
		})
	}
}

// checkCRIMount checks that mpsd's container is given the CRI socket sock
// and mounts its directory from the host at its path, read-only, as the
// volume cri-socket.
func checkCRIMount(t *testing.T, ds *appsv1.DaemonSet, sock string) {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Command, "--kubelet-cri="+sock) {
		t.Errorf("command %q: no --kubelet-cri=%s", c.Command, sock)
	}
	dir := path.Dir(sock)
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
	j := slices.IndexFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "cri-socket" })
	switch {
	case i < 0 || j < 0:
		t.Errorf("no mount at %s (%v) or no volume cri-socket", dir, c.VolumeMounts)
	case c.VolumeMounts[i].Name != "cri-socket" || !c.VolumeMounts[i].ReadOnly:
		t.Errorf("mount at %s: volume %s, read-only %v; want cri-socket, read-only", dir, c.VolumeMounts[i].Name, c.VolumeMounts[i].ReadOnly)
	case ds.Spec.Template.Spec.Volumes[j].HostPath == nil || ds.Spec.Template.Spec.Volumes[j].HostPath.Path != dir:
		t.Errorf("volume cri-socket %+v, want the host's %s", ds.Spec.Template.Spec.Volumes[j].VolumeSource, dir)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestReleaseName renders a release of another name in another namespace,
// every optional object on: its objects are named after it, and they
// still find each other: the DaemonSet's service account is bound to a
// ClusterRole that may get pods (mpsd's root check reads pods with it),
// its ConfigMap is the release's, the ServiceMonitor selects the
// release's Service only.
func TestReleaseName(t *testing.T) {
	rel := common.ReleaseOptions{Name: "gpu-sharing", Namespace: "gpu", Revision: 1, IsInstall: true}
	m, _, err := renderRelease(t, rel, values(t, `{prometheus: {rules: {enabled: true}, serviceMonitor: {enabled: true}}, grafana: {dashboard: {enabled: true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	o := mustDecode(t, m)
	want := []string{"ClusterRole/gpu-sharing-mpsd-pod-reader.gpu", "ClusterRoleBinding/gpu-sharing-mpsd-pod-reader.gpu", "ConfigMap/gpu-sharing-mpsd-config",
		"ConfigMap/gpu-sharing-mpsd-dashboard", "DaemonSet/gpu-sharing-mpsd", "PrometheusRule/gpu-sharing-mpsd", "Service/gpu-sharing-mpsd-metrics",
		"ServiceAccount/gpu-sharing-mpsd", "ServiceMonitor/gpu-sharing-mpsd"}
	if got := o.kinds(); !slices.Equal(got, want) {
		t.Fatalf("objects %v, want %v", got, want)
	}
	for _, x := range o {
		if x.kind != "ClusterRole" && x.kind != "ClusterRoleBinding" && x.namespace != rel.Namespace {
			t.Errorf("%s %s: namespace %q, want the release's %s", x.kind, x.name, x.namespace, rel.Namespace)
		}
	}
	ds := o.get("DaemonSet", "gpu-sharing-mpsd").(*appsv1.DaemonSet)
	spec := ds.Spec.Template.Spec
	if o.get("ServiceAccount", spec.ServiceAccountName) == nil {
		t.Errorf("serviceAccountName %q: no such ServiceAccount", spec.ServiceAccountName)
	}
	mayGetPods := false
	for _, x := range o {
		b, ok := x.obj.(*rbacv1.ClusterRoleBinding)
		if !ok || !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == spec.ServiceAccountName && s.Namespace == rel.Namespace
		}) {
			continue
		}
		if role, _ := o.get("ClusterRole", b.RoleRef.Name).(*rbacv1.ClusterRole); role != nil && b.RoleRef.Kind == "ClusterRole" {
			for _, r := range role.Rules {
				mayGetPods = mayGetPods || slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "get")
			}
		}
	}
	if !mayGetPods {
		t.Errorf("service account %s/%s may not get pods: no ClusterRoleBinding to a ClusterRole that may", rel.Namespace, spec.ServiceAccountName)
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name != "gpu-sharing-mpsd-config" {
			t.Errorf("volume %s: ConfigMap %s, want the release's gpu-sharing-mpsd-config", v.Name, v.ConfigMap.Name)
		}
	}
	sm := o.get("ServiceMonitor", "gpu-sharing-mpsd").(*serviceMonitor)
	if sm.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] != rel.Name || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{rel.Namespace}) {
		t.Errorf("ServiceMonitor selects %v in %v; want the release's Service (instance %s, namespace %s)", sm.Spec.Selector.MatchLabels, sm.Spec.NamespaceSelector.MatchNames, rel.Name, rel.Namespace)
	}
}

// TestValuesStayValues renders values that would add fields or mpsd
// flags if the templates wrote them into the manifests as they are (a
// newline, then YAML at the next line's indentation): each is refused
// (refusedAt names the value in the error), or rendered as the one string
// it is, and no render runs mpsd with --simulate or the pod in the host's
// network.
func TestValuesStayValues(t *testing.T) {
	const arg = "\n            - --simulate"
	container := func(o objects) corev1.Container {
		return o.get("DaemonSet", "mpsd").(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0]
	}
	tests := []struct {
		name      string
		vals      map[string]any
		refusedAt string
		want      string
		got       func(o objects) string
	}{
		{"kubelet.dir", map[string]any{"kubelet": map[string]any{"dir": "/var/lib/kubelet/device-plugins" + arg}}, "/kubelet/dir", "", nil},
		{"kubelet.podResources", map[string]any{"kubelet": map[string]any{"podResources": "/var/lib/kubelet/pod-resources/kubelet.sock" + arg}}, "/kubelet/podResources", "", nil},
		{"kubelet.cri", map[string]any{"kubelet": map[string]any{"cri": "/run/containerd/containerd.sock" + arg}}, "/kubelet/cri", "", nil},
		{"config.run_dir", map[string]any{"config": map[string]any{"run_dir": "/run/mpsd" + arg}}, "/config/run_dir", "", nil},
		{"config.state_dir", map[string]any{"config": map[string]any{"state_dir": "/var/lib/mpsd\n  hostNetwork: true"}}, "/config/state_dir", "", nil},
		{"grafana.dashboard.namespace", map[string]any{"grafana": map[string]any{"dashboard": map[string]any{"enabled": true, "namespace": "monitoring\n  annotations: {a: b}"}}}, "/grafana/dashboard/namespace", "", nil},
		{"runtimeClassName", map[string]any{"runtimeClassName": "nvidia\n      hostNetwork: true"}, "", "nvidia\n      hostNetwork: true", func(o objects) string {
			return *o.get("DaemonSet", "mpsd").(*appsv1.DaemonSet).Spec.Template.Spec.RuntimeClassName
		}},
		{"priorityClassName", map[string]any{"priorityClassName": "system-node-critical\n      hostNetwork: true"}, "", "system-node-critical\n      hostNetwork: true", func(o objects) string {
			return o.get("DaemonSet", "mpsd").(*appsv1.DaemonSet).Spec.Template.Spec.PriorityClassName
		}},
		{"image.tag", map[string]any{"image": map[string]any{"tag": "v1" + arg}}, "", "mpsd:v1" + arg, func(o objects) string { return container(o).Image }},
		{"extraArgs", map[string]any{"extraArgs": []any{"--kubelet-groups=inference" + arg}}, "", "--kubelet-groups=inference" + arg, func(o objects) string {
			return container(o).Command[len(container(o).Command)-1]
		}},
		{"serviceMonitor.interval", map[string]any{"prometheus": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "30s\n      scheme: http"}}}, "", "30s\n      scheme: http", func(o objects) string {
			return o.get("ServiceMonitor", "mpsd").(*serviceMonitor).Spec.Endpoints[0].Interval
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _, err := render(t, tt.vals)
			if tt.refusedAt != "" {
				if err == nil {
					t.Fatalf("values %v rendered; want them refused", tt.vals)
				}
				if !strings.Contains(err.Error(), tt.refusedAt) {
					t.Errorf("error %q does not name %s", err, tt.refusedAt)
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := mustDecode(t, m)
			if got := tt.got(o); got != tt.want {
				t.Errorf("rendered as %q, want %q", got, tt.want)
			}
			ds := o.get("DaemonSet", "mpsd").(*appsv1.DaemonSet)
			if c := container(o); slices.Contains(c.Command, "--simulate") || ds.Spec.Template.Spec.HostNetwork {
				t.Errorf("the value added to the manifest: command %q, hostNetwork %v", c.Command, ds.Spec.Template.Spec.HostNetwork)
			}
		})
	}
}

// TestReleasesInTwoNamespaces renders releases of one name in two
// namespaces, as two teams may install them: their cluster-scoped objects
// (ClusterRole, ClusterRoleBinding) must have names of their own, or the
// second install would fail on, or take over, the first one's, and each
// binding must give its own release's service account its own role.
func TestReleasesInTwoNamespaces(t *testing.T) {
	owner := map[string]string{} // kind/name of a cluster-scoped object -> namespace of its release
	for _, ns := range []string{"mpsd", "gpu"} {
		m, _, err := renderRelease(t, common.ReleaseOptions{Name: release, Namespace: ns, Revision: 1, IsInstall: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := mustDecode(t, m)
		for _, x := range o {
			if x.namespace != "" {
				continue
			}
			if other, ok := owner[x.kind+"/"+x.name]; ok {
				t.Errorf("%s %s: rendered by the releases in namespaces %s and %s", x.kind, x.name, other, ns)
			}
			owner[x.kind+"/"+x.name] = ns
			b, ok := x.obj.(*rbacv1.ClusterRoleBinding)
			if !ok {
				continue
			}
			if o.get("ClusterRole", b.RoleRef.Name) == nil {
				t.Errorf("namespace %s: ClusterRoleBinding %s binds ClusterRole %s, not one of its release's", ns, b.Name, b.RoleRef.Name)
			}
			if len(b.Subjects) != 1 || b.Subjects[0].Namespace != ns || o.get("ServiceAccount", b.Subjects[0].Name) == nil {
				t.Errorf("namespace %s: ClusterRoleBinding %s binds %v, want its release's service account", ns, b.Name, b.Subjects)
			}
		}
	}
	if len(owner) != 4 {
		t.Errorf("cluster-scoped objects %v, want a ClusterRole and a ClusterRoleBinding per release", owner)
	}
}

// TestRefused checks the values the chart refuses and what it says:
// values.schema.json's wrong types, and the templates' own checks.
func TestRefused(t *testing.T) {
	tests := []struct {
		name   string
		values string
		want   []string // in the error, each
	}{
		{"mode dra", `mode: dra`, []string{`mode "dra"`, "allowed values: devicePlugin"}},
		{"mode empty", `mode: ""`, []string{`mode ""`, "allowed values: devicePlugin"}},
		{"mode not a string", `mode: 1`, []string{"values don't meet the specifications of the schema", "/mode"}},
		{"nodeSelector a list", `nodeSelector: [gpu]`, []string{"values don't meet the specifications of the schema", "/nodeSelector"}},
		{"enabled a string", `prometheus: {rules: {enabled: "yes"}}`, []string{"values don't meet the specifications of the schema", "/prometheus/rules/enabled"}},
		{"grace a string", `terminationGracePeriodSeconds: "30"`, []string{"/terminationGracePeriodSeconds"}},
		{"unknown value", `imageTag: v1`, []string{"imageTag"}},
		{"pull policy", `image: {pullPolicy: Sometimes}`, []string{"/image/pullPolicy"}},
		{"config version a string", `config: {version: "1"}`, []string{"/config/version"}},
		{"runbookBase with an anchor", `prometheus: {runbookBase: "https://x/alerts.md#top"}`, []string{"/prometheus/runbookBase"}},
		{"socket outside run_dir", `config: {socket: /tmp/mpsd.sock}`, []string{`config.socket "/tmp/mpsd.sock"`, "run_dir"}},
		{"metrics without a port", `config: {metrics: {listen: localhost}}`, []string{`config.metrics.listen "localhost"`, "host:port"}},
		// Each value that becomes a host path: absolute, one line, clean.
		{"relative state_dir", `config: {state_dir: var/lib/mpsd}`, []string{"values don't meet the specifications of the schema", "/config/state_dir"}},
		{"relative run_dir", `config: {run_dir: run/mpsd, socket: run/mpsd/mpsd.sock}`, []string{"/config/run_dir", "/config/socket"}},
		{"log_dir with ..", `config: {log_dir: /var/log/../lib/mpsd}`, []string{"/config/log_dir"}},
		{"log_dir with .", `config: {log_dir: /var/log/./mpsd}`, []string{"/config/log_dir"}},
		{"log_dir ending in /", `config: {log_dir: /var/log/mpsd/}`, []string{`config.log_dir "/var/log/mpsd/" is not a clean path; write "/var/log/mpsd"`}},
		{"state_dir with //", `config: {state_dir: //var/lib/mpsd}`, []string{`config.state_dir "//var/lib/mpsd" is not a clean path`}},
		{"relative kubelet dir", `kubelet: {dir: var/lib/kubelet/device-plugins}`, []string{"/kubelet/dir"}},
		{"kubelet dir with ..", `kubelet: {dir: /var/lib/kubelet/../../etc}`, []string{"/kubelet/dir"}},
		{"CRI socket with //", `kubelet: {cri: /run/containerd//containerd.sock}`, []string{`kubelet.cri "/run/containerd//containerd.sock" is not a clean path`}},
		{"CRI socket in /", `kubelet: {cri: /containerd.sock}`, []string{"kubelet.cri's directory is /"}},
		// One mount per path: mpsd refuses run_dir, state_dir and log_dir
		// that are one directory or one inside another, and a container
		// cannot have two mounts at one path.
		{"state_dir is log_dir", `config: {state_dir: /var/lib/mpsd, log_dir: /var/lib/mpsd}`, []string{`config.log_dir "/var/lib/mpsd" overlaps config.state_dir "/var/lib/mpsd"`}},
		{"log_dir in state_dir", `config: {log_dir: /var/lib/mpsd/log}`, []string{`config.log_dir "/var/lib/mpsd/log" overlaps config.state_dir "/var/lib/mpsd"`}},
		{"run_dir is state_dir", `config: {state_dir: /run/mpsd}`, []string{`config.state_dir "/run/mpsd" overlaps config.run_dir "/run/mpsd"`}},
		{"CRI socket in run_dir", `kubelet: {cri: /run/mpsd/cri.sock}`, []string{`kubelet.cri's directory and config.run_dir are both "/run/mpsd"`}},
		{"PodResources in the device plugin dir", `kubelet: {podResources: /var/lib/kubelet/device-plugins/kubelet.sock}`, []string{`kubelet.dir and kubelet.podResources' directory are both "/var/lib/kubelet/device-plugins"`}},
		{"state_dir at the config's mount", `config: {state_dir: /etc/mpsd}`, []string{`config.state_dir and the config's mount are both "/etc/mpsd"`}},
		{"extra mount at log_dir", `extraVolumeMounts: [{name: hostshm, mountPath: /var/log/mpsd}]`, []string{`config.log_dir and extraVolumeMounts' hostshm are both "/var/log/mpsd"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := render(t, values(t, tt.values))
			if err == nil {
				t.Fatalf("values %q rendered; want them refused", tt.values)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestLint runs helm lint's rules through the library (lint.RunAll: the
// chart file, values and schema, templates rendered strictly, every
// object's kind known to Kubernetes 1.37), with the default values and
// with every optional object on; neither may give a warning or an error.
func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, values string }{
		{"defaults", ``},
		{"optional objects on", `{prometheus: {rules: {enabled: true}, serviceMonitor: {enabled: true}, runbookBase: "https://docs.example.com/alerts.md"}, grafana: {dashboard: {enabled: true}}}`},
		{"config and placement", nonDefaultValues},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := lint.RunAll(chartDir, values(t, tt.values), namespace, lint.WithKubeVersion(kv))
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %v", m)
				} else {
					t.Logf("lint: %v", m)
				}
			}
		})
	}
}

// TestChartCopiesExamples keeps the chart's copies of examples/'s alert
// rules and dashboard equal to them; -update copies them again.
func TestChartCopiesExamples(t *testing.T) {
	for dst, src := range copies {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.WriteFile(dst, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatalf("%v (regenerate: %s)", err, regen)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not a copy of %s (regenerate: %s)", dst, src, regen)
		}
	}
}
