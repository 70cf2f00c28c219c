// Package kubernetes holds the Kubernetes examples (a DaemonSet running
// mpsd --kubelet-device-plugin, a pod using it, and the admission policy
// that keeps pods asking for mpsd's units from running as host root) and
// their test: each YAML document decodes strictly into the k8s.io/api
// types and passes the checks `kubectl apply --dry-run=client` and the API
// server would make, and the files agree with each other and with mpsd's
// config schema (policy_test.go evaluates the policy's expressions).
package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/internal/ociimage"
	"github.com/mpsd/mpsd/policy"
)

var files = []string{"mpsd-daemonset.yaml", "mpsd-pod-policy.yaml", "pod-example.yaml"}

// objects are the decoded documents of the examples.
type objects struct {
	namespaces map[string]bool
	configMaps map[string]*corev1.ConfigMap // by namespace/name
	daemonSets []*appsv1.DaemonSet
	pods       []*corev1.Pod

	serviceAccounts     map[string]bool // namespace/name
	clusterRoles        map[string]*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	policies            map[string]*admissionregistrationv1.ValidatingAdmissionPolicy
	policyBindings      []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decode reads the YAML documents of each file strictly: a known
// apiVersion and kind, no unknown or repeated fields. It returns the
// problems found, each naming its file and document.
func decode(srcs map[string][]byte) (*objects, []string) {
	o := &objects{namespaces: map[string]bool{}, configMaps: map[string]*corev1.ConfigMap{}, serviceAccounts: map[string]bool{},
		clusterRoles: map[string]*rbacv1.ClusterRole{}, policies: map[string]*admissionregistrationv1.ValidatingAdmissionPolicy{}}
	var problems []string
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, file := range names {
		for i, doc := range docSep.Split(string(srcs[file]), -1) {
			where := fmt.Sprintf("%s document %d", file, i+1)
			if strings.TrimSpace(stripComments(doc)) == "" {
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
			case "apps/v1 DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "v1 Pod":
				obj = &corev1.Pod{}
			case "v1 ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			default:
				problems = append(problems, fmt.Sprintf("%s: apiVersion %q kind %q: not a type these examples use (missing apiVersion or kind?)", where, tm.APIVersion, tm.Kind))
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			meta := objectMeta(obj)
			for _, msg := range validation.IsDNS1123Subdomain(meta.Name) {
				problems = append(problems, fmt.Sprintf("%s: metadata.name %q: %s", where, meta.Name, msg))
			}
			if meta.Namespace != "" {
				for _, msg := range validation.IsDNS1123Label(meta.Namespace) {
					problems = append(problems, fmt.Sprintf("%s: metadata.namespace %q: %s", where, meta.Namespace, msg))
				}
			}
			switch v := obj.(type) {
			case *corev1.Namespace:
				o.namespaces[v.Name] = true
			case *corev1.ConfigMap:
				o.configMaps[v.Namespace+"/"+v.Name] = v
			case *appsv1.DaemonSet:
				o.daemonSets = append(o.daemonSets, v)
			case *corev1.Pod:
				o.pods = append(o.pods, v)
			case *corev1.ServiceAccount:
				o.serviceAccounts[v.Namespace+"/"+v.Name] = true
			case *rbacv1.ClusterRole:
				o.clusterRoles[v.Name] = v
			case *rbacv1.ClusterRoleBinding:
				o.clusterRoleBindings = append(o.clusterRoleBindings, v)
			case *admissionregistrationv1.ValidatingAdmissionPolicy:
				o.policies[v.Name] = v
			case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
				o.policyBindings = append(o.policyBindings, v)
			}
		}
	}
	return o, problems
}

func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func objectMeta(obj any) metav1.ObjectMeta {
	switch v := obj.(type) {
	case *corev1.Namespace:
		return v.ObjectMeta
	case *corev1.ConfigMap:
		return v.ObjectMeta
	case *appsv1.DaemonSet:
		return v.ObjectMeta
	case *corev1.Pod:
		return v.ObjectMeta
	case *corev1.ServiceAccount:
		return v.ObjectMeta
	case *rbacv1.ClusterRole:
		return v.ObjectMeta
	case *rbacv1.ClusterRoleBinding:
		return v.ObjectMeta
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		return v.ObjectMeta
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		return v.ObjectMeta
	}
	return metav1.ObjectMeta{}
}

// h100s is the host the example config is checked against: 8 H100 80GB as
// NVML reports them.
func h100s() []policy.GPU {
	gpus := make([]policy.GPU, 8)
	for i := range gpus {
		gpus[i] = policy.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i), Memory: 85520809984}
	}
	return gpus
}

type users struct{}

func (users) UserID(name string) (uint32, error) {
	if name == "root" {
		return 0, nil
	}
	return 0, fmt.Errorf("no user %q", name)
}

func (users) GroupID(name string) (uint32, error) { return 0, fmt.Errorf("no group %q", name) }

// check finds what the API server would refuse and where the examples
// disagree with each other or with mpsd: the DaemonSet's selector and
// template, its containers, volumes and mounts, the config it mounts (valid
// for mpsd, its directories mounted from the host at the same paths, the
// device plugin on), and the pods' resources (groups the config has, as
// Kubernetes wants extended resources).
func (o *objects) check() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var cfg *policy.Config
	for _, ds := range o.daemonSets {
		where := "DaemonSet " + ds.Namespace + "/" + ds.Name
		if ds.Namespace != "" && !o.namespaces[ds.Namespace] {
			bad("%s: namespace %s is not created by the examples", where, ds.Namespace)
		}
		sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
		switch {
		case ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchLabels)+len(ds.Spec.Selector.MatchExpressions) == 0:
			bad("%s: spec.selector is required", where)
		case err != nil:
			bad("%s: spec.selector: %v", where, err)
		case !sel.Matches(labels.Set(ds.Spec.Template.Labels)):
			bad("%s: spec.selector does not match the template's labels %v", where, ds.Spec.Template.Labels)
		}
		spec := ds.Spec.Template.Spec
		problems = append(problems, checkPodSpec(where, spec)...)
		if !spec.HostPID {
			bad("%s: hostPID is needed by NVIDIA's MPS server", where)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
			if v.HostPath != nil && !path.IsAbs(v.HostPath.Path) {
				bad("%s: volume %s: hostPath %q is not absolute", where, v.Name, v.HostPath.Path)
			}
			if v.ConfigMap != nil && o.configMaps[ds.Namespace+"/"+v.ConfigMap.Name] == nil {
				bad("%s: volume %s: no ConfigMap %s in namespace %s", where, v.Name, v.ConfigMap.Name, ds.Namespace)
			}
		}
		for _, c := range spec.Containers {
			// hostMounts maps each container path mounted from the host to
			// the host path.
			hostMounts := map[string]string{}
			// propagation maps each container path to its mount
			// propagation.
			propagation := map[string]corev1.MountPropagationMode{}
			// hostFiles holds the container paths bound read-only to a
			// host file (hostPath type File).
			hostFiles := map[string]bool{}
			var cfgPath, cfgMap string
			for _, m := range c.VolumeMounts {
				v, ok := vols[m.Name]
				if !ok {
					bad("%s: container %s mounts volume %s, which is not in spec.volumes", where, c.Name, m.Name)
					continue
				}
				if v.HostPath != nil {
					hostMounts[m.MountPath] = v.HostPath.Path
					hostFiles[m.MountPath] = m.ReadOnly && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathFile
				}
				if m.MountPropagation != nil {
					propagation[m.MountPath] = *m.MountPropagation
				}
				if v.ConfigMap != nil {
					cfgPath, cfgMap = m.MountPath, v.ConfigMap.Name
				}
			}
			args := slices.Concat(c.Command, c.Args)
			if len(args) == 0 || path.Base(args[0]) != "mpsd" {
				continue
			}
			// The image make package-image builds (internal/ociimage):
			// mpsd:<version>, mpsd at its entrypoint's path.
			if repo, _, _ := strings.Cut(c.Image, ":"); repo != ociimage.Repository || len(c.Command) > 0 && c.Command[0] != ociimage.Entrypoint {
				bad("%s: container %s runs %s from image %s; want %s from make package-image's %s", where, c.Name, args[0], c.Image, ociimage.Entrypoint, ociimage.Ref("<version>"))
			}
			if !slices.Contains(args, "--kubelet-device-plugin") {
				bad("%s: container %s runs mpsd without --kubelet-device-plugin", where, c.Name)
			}
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				bad("%s: container %s: mpsd drives GPUs and MPS daemons: privileged", where, c.Name)
			}
			// The config's users and groups resolve through the user
			// database (policy's host lookups, unix groups' members);
			// the image's lists only root, the node's are the ones meant.
			for _, f := range []string{"/etc/passwd", "/etc/group"} {
				if hostMounts[f] != f || !hostFiles[f] {
					bad("%s: container %s: mount the host's %s read-only (hostPath type File) at %s: the config's users and groups resolve through it, and the image's lists only root", where, c.Name, f, f)
				}
			}
			kdir := flagValue(args, "--kubelet-dir", deviceplugin.DefaultKubeletDir)
			if hostMounts[kdir] != deviceplugin.DefaultKubeletDir {
				bad("%s: container %s: --kubelet-dir %s is not the host's %s", where, c.Name, kdir, deviceplugin.DefaultKubeletDir)
			}
			// The groups the plugin serves run their daemons with a
			// private /dev/shm under run_dir, which their pods get; only
			// groups left out of --kubelet-groups (clients on the host)
			// use the host's.
			if served := flagValue(args, "--kubelet-groups", ""); served == "" && hostMounts["/dev/shm"] != "" {
				bad("%s: container %s: mounts the host's /dev/shm, which no MPS daemon uses when the plugin serves every group (each has a private one under run_dir)", where, c.Name)
			} else if served != "" && hostMounts["/dev/shm"] != "/dev/shm" {
				bad("%s: container %s: groups outside --kubelet-groups share memory with host clients through the host's /dev/shm: mount it at /dev/shm", where, c.Name)
			}
			// The tie of each lease to its container (--kubelet-cri)
			// finds the container's processes in the host's cgroup
			// hierarchy and holds them to the lease there.
			if flagValue(args, "--kubelet-cri", "") != "" && hostMounts["/sys/fs/cgroup"] != "/sys/fs/cgroup" {
				bad("%s: container %s: --kubelet-cri ties leases to containers through their cgroups: mount the host's /sys/fs/cgroup at /sys/fs/cgroup", where, c.Name)
			}
			// The root check (on unless --kubelet-allow-host-root) reads
			// pods' specs and the kubelet's PodResources socket.
			if !slices.Contains(args, "--kubelet-allow-host-root") {
				problems = append(problems, o.checkRootCheck(where, c.Name, ds.Namespace, spec.ServiceAccountName, args, hostMounts)...)
			}
			cfgFile := flagValue(args, "--config", "/etc/mpsd/mpsd.yaml")
			cm := o.configMaps[ds.Namespace+"/"+cfgMap]
			if cm == nil || path.Dir(cfgFile) != cfgPath || cm.Data[path.Base(cfgFile)] == "" {
				bad("%s: container %s: --config %s is not a key of a mounted ConfigMap", where, c.Name, cfgFile)
				continue
			}
			cfg, err = policy.Parse(strings.NewReader(cm.Data[path.Base(cfgFile)]), policy.Host{GPUs: h100s(), Users: users{}})
			if err != nil {
				bad("%s: ConfigMap %s: %v", where, cm.Name, err)
				continue
			}
			// The plugin hands pods host paths under run_dir; mpsd's state
			// and logs must outlive the container.
			// mpsd mounts each instance's private /dev/shm (a tmpfs) in the
			// host's mount namespace, under run_dir, and must see it there.
			if p := propagation[cfg.RunDir]; p != corev1.MountPropagationHostToContainer && p != corev1.MountPropagationBidirectional {
				bad("%s: container %s: run_dir %s is mounted without mountPropagation: HostToContainer; mpsd would not see the private /dev/shm it mounts there on the host", where, c.Name, cfg.RunDir)
			}
			for _, dir := range []string{cfg.RunDir, cfg.StateDir, cfg.LogDir, path.Dir(cfg.Socket)} {
				if hostMounts[dir] != dir {
					bad("%s: container %s: %s is not mounted from the host's %s", where, c.Name, dir, dir)
				}
			}
			for _, g := range cfg.Groups {
				uids, _, _ := cfg.Access.Members(g.Name)
				if !g.Multiuser || !slices.Contains(uids, 0) {
					bad("%s: group %s: groups offered to Kubernetes need multiuser: true (pods run as any uid) and root among their users (the plugin leases as root)", where, g.Name)
				}
			}
		}
	}
	problems = append(problems, o.checkPolicies()...)
	for _, p := range o.pods {
		where := "Pod " + p.Name
		problems = append(problems, checkPodSpec(where, p.Spec)...)
		for _, c := range p.Spec.Containers {
			for name, q := range c.Resources.Limits {
				group, ok := strings.CutPrefix(string(name), deviceplugin.ResourceDomain+"/")
				if !ok {
					continue
				}
				group, _ = strings.CutSuffix(group, "-sm")
				if cfg == nil || !slices.ContainsFunc(cfg.Groups, func(g policy.Group) bool { return g.Name == group }) {
					bad("%s: container %s asks for %s, a group the example config does not have", where, c.Name, name)
					continue
				}
				g, _ := cfg.Group(group)
				if q.MilliValue()%1000 != 0 || q.Value() < 1 || q.Value() > int64(g.SMPercent) {
					bad("%s: container %s: %s: %s; want a whole number of units, 1 to %d", where, c.Name, name, q.String(), g.SMPercent)
				}
				if r, ok := c.Resources.Requests[name]; ok && r.Cmp(q) != 0 {
					bad("%s: container %s: %s: requests must equal limits for an extended resource", where, c.Name, name)
				}
			}
			for name := range c.Resources.Requests {
				if _, ok := c.Resources.Limits[name]; !ok && strings.HasPrefix(string(name), deviceplugin.ResourceDomain+"/") {
					bad("%s: container %s: %s: an extended resource goes in limits", where, c.Name, name)
				}
			}
		}
	}
	return problems
}

// checkRootCheck checks that mpsd's root check can work in the DaemonSet:
// the kubelet's PodResources socket's directory is mounted from the host
// at its path, and the pods' specs can be read: in-cluster, the pod's
// service account exists and is bound to a ClusterRole that may get pods;
// else the kubeconfig is mounted from the host.
func (o *objects) checkRootCheck(where, ctr, ns, sa string, args []string, hostMounts map[string]string) []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	sock := flagValue(args, "--kubelet-pod-resources", kubeinfo.DefaultPodResourcesSocket)
	if dir := path.Dir(sock); hostMounts[dir] != dir {
		bad("%s: container %s: the kubelet's PodResources socket %s: %s is not mounted from the host's %s", where, ctr, sock, dir, dir)
	}
	// The runtime's CRI socket: each lease is bound to its pod's
	// container through it.
	if cri := flagValue(args, "--kubelet-cri", kubeinfo.DefaultRuntimeSocket); hostMounts[path.Dir(cri)] != path.Dir(cri) {
		bad("%s: container %s: the container runtime's CRI socket %s: %s is not mounted from the host's %s", where, ctr, cri, path.Dir(cri), path.Dir(cri))
	}
	kc := flagValue(args, "--kubelet-kubeconfig", kubeinfo.DefaultKubeconfig)
	if kc != kubeinfo.InCluster {
		if dir := path.Dir(kc); hostMounts[dir] != dir {
			bad("%s: container %s: --kubelet-kubeconfig %s is not mounted from the host", where, ctr, kc)
		}
		return problems
	}
	if sa == "" || !o.serviceAccounts[ns+"/"+sa] {
		bad("%s: container %s: --kubelet-kubeconfig=in-cluster reads pods' specs as the pod's service account: set serviceAccountName to one the examples create in %s", where, ctr, ns)
		return problems
	}
	for _, b := range o.clusterRoleBindings {
		bound := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ns
		})
		role := o.clusterRoles[b.RoleRef.Name]
		if !bound || b.RoleRef.Kind != "ClusterRole" || role == nil {
			continue
		}
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") && (slices.Contains(r.Verbs, "get") || slices.Contains(r.Verbs, "*")) {
				return problems
			}
		}
	}
	bad("%s: container %s: service account %s/%s may not get pods (no ClusterRoleBinding to a ClusterRole that may): the root check would refuse every container", where, ctr, ns, sa)
	return problems
}

// checkPolicies checks the admission policies: each binding names a
// policy of the examples and denies, and each policy is checked when pods
// are created and fails closed.
func (o *objects) checkPolicies() []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	bound := map[string]bool{}
	for _, b := range o.policyBindings {
		if o.policies[b.Spec.PolicyName] == nil {
			bad("ValidatingAdmissionPolicyBinding %s: no policy %q in the examples", b.Name, b.Spec.PolicyName)
		}
		if !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
			bad("ValidatingAdmissionPolicyBinding %s: validationActions %v do not deny", b.Name, b.Spec.ValidationActions)
		}
		bound[b.Spec.PolicyName] = true
	}
	for name, p := range o.policies {
		where := "ValidatingAdmissionPolicy " + name
		if !bound[name] {
			bad("%s: no binding: it is never applied", where)
		}
		if fp := p.Spec.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail {
			bad("%s: failurePolicy %s: a policy that cannot be evaluated must refuse", where, *fp)
		}
		creates := false
		if mc := p.Spec.MatchConstraints; mc != nil {
			for _, r := range mc.ResourceRules {
				if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") &&
					(slices.Contains(r.Operations, admissionregistrationv1.Create) || slices.Contains(r.Operations, admissionregistrationv1.OperationAll)) {
					creates = true
				}
			}
		}
		if !creates {
			bad("%s: does not match the creation of pods", where)
		}
		if len(p.Spec.Validations) == 0 {
			bad("%s: no validations", where)
		}
	}
	return problems
}

// checkPodSpec checks what every pod template needs: containers with names
// and images, volume mounts of volumes it has.
func checkPodSpec(where string, spec corev1.PodSpec) []string {
	var problems []string
	if len(spec.Containers) == 0 {
		problems = append(problems, where+": no containers")
	}
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		vols[v.Name] = true
	}
	for _, c := range spec.Containers {
		if len(validation.IsDNS1123Label(c.Name)) > 0 || c.Image == "" {
			problems = append(problems, fmt.Sprintf("%s: container %q needs a DNS label name and an image", where, c.Name))
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				problems = append(problems, fmt.Sprintf("%s: container %s mounts volume %s, which is not in spec.volumes", where, c.Name, m.Name))
			}
		}
	}
	return problems
}

// flagValue is the value of --name=v or --name v in args, else def.
func flagValue(args []string, name, def string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return def
}

func readExamples(t *testing.T) map[string][]byte {
	t.Helper()
	srcs := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		srcs[f] = b
	}
	return srcs
}

func TestExamples(t *testing.T) {
	o, problems := decode(readExamples(t))
	problems = append(problems, o.check()...)
	for _, p := range problems {
		t.Error(p)
	}
	if len(o.daemonSets) != 1 || len(o.pods) != 1 || len(o.configMaps) != 1 {
		t.Errorf("decoded %d DaemonSets, %d Pods, %d ConfigMaps; want one of each", len(o.daemonSets), len(o.pods), len(o.configMaps))
	}
}

// The checks catch what they are there for: each broken variant of the
// examples yields the problem named.
func TestExamplesBroken(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"unknown field", "pod-example.yaml", "  restartPolicy: OnFailure", "  restartPolicy: OnFailure\n  restartPolicyy: Never", `unknown field "restartPolicyy"`},
		{"repeated field", "pod-example.yaml", "  restartPolicy: OnFailure", "  restartPolicy: OnFailure\n  restartPolicy: Never", `key "restartPolicy" already set`},
		{"no apiVersion", "pod-example.yaml", "apiVersion: v1\n", "", `apiVersion "" kind "Pod"`},
		{"wrong apiVersion", "mpsd-daemonset.yaml", "apiVersion: apps/v1", "apiVersion: extensions/v1beta1", `apiVersion "extensions/v1beta1" kind "DaemonSet"`},
		{"bad name", "pod-example.yaml", "name: vectoradd-30sm", "name: VectorAdd", `metadata.name "VectorAdd"`},
		{"selector misses the template", "mpsd-daemonset.yaml", "      app.kubernetes.io/name: mpsd\n  # A restart", "      app.kubernetes.io/name: mpsd-x\n  # A restart", "spec.selector does not match"},
		{"mount of no volume", "mpsd-daemonset.yaml", "            - name: logs\n              mountPath: /var/log/mpsd", "            - name: logss\n              mountPath: /var/log/mpsd", "mounts volume logss"},
		{"the host's /dev/shm", "mpsd-daemonset.yaml", "            - name: config\n              mountPath: /etc/mpsd", "            - name: hostshm\n              mountPath: /dev/shm\n            - name: config\n              mountPath: /etc/mpsd", "mounts the host's /dev/shm"},
		{"some groups without the host's /dev/shm", "mpsd-daemonset.yaml", "            - --kubelet-device-plugin\n", "            - --kubelet-device-plugin\n            - --kubelet-groups=inference\n", "through the host's /dev/shm"},
		{"a group the config lacks", "pod-example.yaml", "mpsd.io/inference-sm: 30", "mpsd.io/training-sm: 30", "mpsd.io/training-sm, a group the example config does not have"},
		{"fractional units", "pod-example.yaml", "mpsd.io/inference-sm: 30", "mpsd.io/inference-sm: 500m", "want a whole number of units"},
		{"not multiuser", "mpsd-daemonset.yaml", "multiuser: true", "multiuser: false", "need multiuser: true"},
		{"config mpsd refuses", "mpsd-daemonset.yaml", "memory: 32G", "memory: 32G\n        memroy: 1G", "memroy"},
		{"run_dir not from the host", "mpsd-daemonset.yaml", "run_dir: /run/mpsd ", "run_dir: /run/mpsd2 ", "/run/mpsd2 is not mounted from the host"},
		{"run_dir without propagation", "mpsd-daemonset.yaml", "              mountPropagation: HostToContainer\n", "", "without mountPropagation: HostToContainer"},
		{"another image", "mpsd-daemonset.yaml", "image: mpsd:", "image: registry.example.com/mpsd:", "from make package-image's"},
		{"mpsd not at the image's path", "mpsd-daemonset.yaml", "            - /usr/bin/mpsd\n", "            - /usr/local/bin/mpsd\n", "from make package-image's"},
		{"no host cgroups", "mpsd-daemonset.yaml", "            - name: cgroup\n              mountPath: /sys/fs/cgroup\n", "", "mount the host's /sys/fs/cgroup"},
		{"no host passwd", "mpsd-daemonset.yaml", "            - name: passwd\n              mountPath: /etc/passwd\n              readOnly: true\n", "", "mount the host's /etc/passwd read-only"},
		{"host group writable", "mpsd-daemonset.yaml", "              mountPath: /etc/group\n              readOnly: true\n", "              mountPath: /etc/group\n", "mount the host's /etc/group read-only"},
		{"host group not a file", "mpsd-daemonset.yaml", "            path: /etc/group\n            type: File\n", "            path: /etc/group\n            type: FileOrCreate\n", "mount the host's /etc/group read-only"},
		{"no device plugin", "mpsd-daemonset.yaml", "            - --kubelet-device-plugin\n", "", "without --kubelet-device-plugin"},
		{"no service account", "mpsd-daemonset.yaml", "      serviceAccountName: mpsd\n", "", "reads pods' specs as the pod's service account"},
		{"a service account that may not get pods", "mpsd-daemonset.yaml", `verbs: ["get"]`, `verbs: ["list"]`, "may not get pods"},
		{"no PodResources socket", "mpsd-daemonset.yaml", "            - name: pod-resources\n              mountPath: /var/lib/kubelet/pod-resources\n", "", "PodResources socket"},
		{"a kubeconfig not from the host", "mpsd-daemonset.yaml", "- --kubelet-kubeconfig=in-cluster", "- --kubelet-kubeconfig=/etc/kubernetes/kubelet.conf", "is not mounted from the host"},
		{"a binding of no policy", "mpsd-pod-policy.yaml", "  policyName: mpsd-pods-not-host-root", "  policyName: mpsd-pods", `no policy "mpsd-pods"`},
		{"a binding that only warns", "mpsd-pod-policy.yaml", "validationActions: [Deny]", "validationActions: [Warn]", "do not deny"},
		{"a policy that fails open", "mpsd-pod-policy.yaml", "failurePolicy: Fail", "failurePolicy: Ignore", "must refuse"},
		{"a policy not on pod creation", "mpsd-pod-policy.yaml", `operations: ["CREATE", "UPDATE"]`, `operations: ["UPDATE"]`, "does not match the creation of pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srcs := readExamples(t)
			if !bytes.Contains(srcs[tc.file], []byte(tc.old)) {
				t.Fatalf("%s has no %q", tc.file, tc.old)
			}
			srcs[tc.file] = bytes.Replace(srcs[tc.file], []byte(tc.old), []byte(tc.new), 1)
			o, problems := decode(srcs)
			problems = append(problems, o.check()...)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("problems %q; want one containing %q", problems, tc.want)
			}
		})
	}
}
