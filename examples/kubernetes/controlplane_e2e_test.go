package kubernetes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The control-plane end-to-end test runs a one-node Kubernetes cluster on
// this machine: etcd and kube-apiserver (hack/build-apiserver.sh),
// kube-scheduler and kube-controller-manager (hack/build-control-plane.sh),
// and the kubelet (hack/build-kubelet.sh) registered as a node of the API
// server, on containerd 1.7 (hack/build-control-plane.sh) with CDI enabled
// and Debian's runc. It is the rig a DRA kubelet plugin (mpsd
// --kubelet-dra) is tested in: the plugin reads its claims from the API
// server, the scheduler allocates them, and the kubelet hands the devices
// to containerd as CDI devices, which Debian's containerd 1.6 ignores.
//
// The host is left as it was, as in the kubelet test (whose namespaces,
// overlays and read-only /proc/sys it reuses): the controller manager's
// flex volume directory is under the test's directory (it would create
// /usr/libexec/kubernetes on the host), every port is a free one on
// 127.0.0.1, and the test checks the kubelet's host-wide sysctls and the
// fixed paths before and after.
const (
	// controlPlaneRequireEnv=1 (CI) makes a missing engine a failure
	// instead of a skip.
	controlPlaneRequireEnv = "MPSD_REQUIRE_CONTROLPLANE"
	// controlPlaneCacheEnv is hack/build-control-plane.sh's cache (the
	// Makefile exports it).
	controlPlaneCacheEnv = "MPSD_CONTROLPLANE_CACHE"
	// controlPlaneWorkEnv marks the re-executed test (its work dir).
	controlPlaneWorkEnv = "MPSD_CONTROLPLANE_E2E_WORK"
	// rigDriver is the DRA driver of the hand-made ResourceSlice and the
	// vendor of the hand-written CDI spec: no plugin serves it.
	rigDriver = "rig.mpsd.invalid"
	// rigDeviceClass selects rigDriver's devices.
	rigDeviceClass = "rig-gpu"
	// rigCDIDevice is the hand-written CDI spec's device.
	rigCDIDevice = rigDriver + "/gpu=gpu0"
)

// findControlPlane looks for what findNode looks for (but Debian's
// containerd: the control plane's cache has containerd 1.7), and
// kube-apiserver, etcd, kube-scheduler, kube-controller-manager,
// containerd and its runc shim in the build scripts' caches; without one
// the test skips, or fails when MPSD_REQUIRE_CONTROLPLANE=1.
func findControlPlane(t *testing.T) engines {
	t.Helper()
	missing := missingEngine(t, controlPlaneRequireEnv)
	e := findNode(t, missing)
	apiserver := engineCache(apiserverCacheEnv, "apiserver")
	cp := engineCache(controlPlaneCacheEnv, "controlplane")
	e.APIServer, e.Etcd = filepath.Join(apiserver, "kube-apiserver"), filepath.Join(apiserver, "etcd")
	e.Scheduler, e.ControllerManager = filepath.Join(cp, "kube-scheduler"), filepath.Join(cp, "kube-controller-manager")
	e.Containerd, e.ShimDir = filepath.Join(cp, "containerd"), cp
	for _, p := range []string{e.APIServer, e.Etcd, e.Scheduler, e.ControllerManager, e.Containerd, filepath.Join(cp, "containerd-shim-runc-v2")} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			missing("no %s at %s (run hack/build-apiserver.sh and hack/build-control-plane.sh; make test does): %v", filepath.Base(p), p, err)
		}
	}
	e.CDI = true
	e.CgroupRoot = fmt.Sprintf("mpsd-controlplane-e2e-%d", os.Getpid())
	return e
}

// hostState is what the control plane would change on the host if it
// were not kept in its namespaces: the kubelet's six sysctls, and
// whether the paths the kubelet, containerd and the controller manager
// write whatever they are told exist.
func hostState(t *testing.T) map[string]string {
	t.Helper()
	st := map[string]string{}
	for _, name := range []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"} {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			t.Fatal(err)
		}
		st[name] = strings.TrimSpace(string(b))
	}
	for _, p := range []string{"/usr/libexec/kubernetes", "/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd", "/etc/cdi", "/var/run/cdi", "/etc/kubernetes"} {
		_, err := os.Lstat(p)
		st[p] = fmt.Sprintf("exists %v", err == nil)
	}
	return st
}

// TestControlPlaneE2E: on a one-node cluster the node becomes Ready, a
// Deployment's pod is scheduled by the scheduler and runs; containerd
// applies a hand-written CDI spec's device to a container asking for it
// through the CRI (the path the kubelet hands DRA devices down); the API
// server serves resource.k8s.io/v1 with consumable capacity: a
// DeviceClass and a ResourceSlice with consumable capacity read back as
// written, the scheduler allocates claims for pods (one by name, one from
// a template the controller manager turns into a claim) consuming the
// capacity they ask, and keeps a pod whose claim does not fit in what is
// left Pending as unschedulable. No DRA plugin serves the slice's
// driver: the kubelet holds an allocated pod, its event saying the driver
// is not registered (where a later test starts mpsd --kubelet-dra).
func TestControlPlaneE2E(t *testing.T) {
	if work := os.Getenv(controlPlaneWorkEnv); work != "" {
		controlPlaneInside(t, work, readEngines(t, work))
		return
	}
	e := findControlPlane(t)
	before := hostState(t)
	t.Cleanup(func() {
		after := hostState(t)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("the host changed: %s was %q, is %q", k, v, after[k])
			}
		}
	})
	work := workDir(t, "k8scp")
	cgroupRoot(t, e.CgroupRoot)
	inNamespaces(t, "TestControlPlaneE2E", controlPlaneWorkEnv, work, e)
}

// controlPlaneInside is the test proper, in the namespaces.
func controlPlaneInside(t *testing.T, work string, e engines) {
	if os.Getpid() == 1 {
		t.Fatal("the test runs under the namespace's init, not as it")
	}
	began := time.Now()
	step := func(format string, args ...any) {
		t.Helper()
		t.Logf("%5.1fs "+format, append([]any{time.Since(began).Seconds()}, args...)...)
	}
	cl := startCluster(t, work, e, step)
	defer cl.k.stop()
	a, apiserver, scheduler := cl.a, cl.apiserver, cl.scheduler

	// A Deployment: the controller manager makes its pod, the scheduler
	// binds it to the node, the kubelet runs it.
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "rig-busybox", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "rig-busybox"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "rig-busybox"}},
				Spec:       rigPodSpec(nil),
			},
		},
	}
	a.create(t, "/apis/apps/v1/namespaces/default/deployments", dep)
	var running corev1.Pod
	scheduler.waitUntil(t, "the Deployment's pod scheduled and running", func() (bool, string) {
		var pods corev1.PodList
		if err := a.get("/api/v1/namespaces/default/pods?labelSelector="+url.QueryEscape("app=rig-busybox"), &pods); err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		running = pods.Items[0]
		p := &running
		cs := p.Status.ContainerStatuses
		return p.Spec.NodeName == nodeName && p.Status.Phase == corev1.PodRunning && len(cs) == 1 && cs[0].Ready && cs[0].State.Running != nil,
			fmt.Sprintf("pod %s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
	})
	if c := podCondition(&running, corev1.PodScheduled); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("the Deployment's pod %s runs without a PodScheduled condition: %+v", running.Name, running.Status.Conditions)
	}
	step("the Deployment's pod %s scheduled to %s and running", running.Name, running.Spec.NodeName)

	checkDRA(t, step, cl)
	step("memory: %s", namespaceRSS())

	// Teardown through the API first, so the kubelet ends the pods.
	a.remove(t, "/apis/apps/v1/namespaces/default/deployments/rig-busybox")
	for _, pod := range []string{"dra-sm30", "dra-template", "dra-sm80"} {
		a.remove(t, "/api/v1/namespaces/default/pods/"+pod)
	}
	apiserver.waitUntil(t, "every pod gone", func() (bool, string) {
		var pods corev1.PodList
		if err := a.get("/api/v1/namespaces/default/pods", &pods); err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range pods.Items {
			left = append(left, p.Name+" "+string(p.Status.Phase))
		}
		return len(left) == 0, fmt.Sprint(left)
	})
	step("pods deleted")
}

// cluster is a one-node cluster in the test's namespaces: containerd 1.7
// with CDI (its spec directory cdiDir(work)), etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager and the kubelet registered as
// node nodeName, its root directory k.root (a DRA kubelet plugin
// registers under k.root/plugins_registry), with the node Ready and the
// default service account made. certs issue more clients
// (certs.clientKubeconfig with a.base); a is the cluster's admin.
type cluster struct {
	work                     string
	ctrd                     *containerd
	a                        *apiClient
	certs                    *pki
	apiserver, scheduler, cm *controlProc
	k                        *kubelet
}

// startCluster starts the cluster in work, in the namespaces (isolateHost
// first), and checks, before the API server starts, that containerd
// applies a hand-written CDI spec's device asked for through the CRI. The
// caller stops the kubelet (k.stop) once it has deleted its pods; the
// rest stops when the test ends.
func startCluster(t *testing.T, work string, e engines, step func(string, ...any)) *cluster {
	t.Helper()
	isolateHost(t, work)
	// containerd finds its shim in its PATH: 1.7's, not Debian's.
	t.Setenv("PATH", e.ShimDir+":"+os.Getenv("PATH"))
	control := filepath.Join(work, "control")
	for _, d := range []string{control, filepath.Join(work, "manifests"), filepath.Join(work, "containerd", "cni-conf"), cdiDir(work), filepath.Join(work, "flex")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A CNI config containerd loads (the node is NotReady without one);
	// the pods use the host's network, so no plugin ever runs.
	if err := os.WriteFile(filepath.Join(work, "containerd", "cni-conf", "10-rig.conflist"),
		[]byte(`{"cniVersion": "1.0.0", "name": "rig", "plugins": [{"type": "loopback"}]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeRigCDISpec(t, work)

	cl := &cluster{work: work}
	cl.ctrd = startContainerd(t, work, e)
	importImages(t, work, e, cl.ctrd)
	out, err := exec.Command(e.Ctr, "--address", cl.ctrd.socket, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Version:  v1.7.") {
		t.Fatalf("containerd's version: %v\n%s\nwant 1.7 (the control plane's build)", err, out)
	}
	step("containerd 1.7 up with CDI, images imported")
	checkCRICDI(t, work, e, cl.ctrd)
	step("a CDI device asked for through the CRI applied")

	cl.a, cl.apiserver, cl.certs = startAPIServer(t, control, e.APIServer, e.Etcd)
	step("etcd and kube-apiserver up")
	a := cl.a
	cl.scheduler = startControl(t, control, e.Scheduler,
		"--kubeconfig="+cl.certs.clientKubeconfig(t, "scheduler", a.base, "system:kube-scheduler"),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", freePort(t)), "--leader-elect=false")
	cl.cm = startControl(t, control, e.ControllerManager,
		"--kubeconfig="+cl.certs.clientKubeconfig(t, "controller-manager", a.base, "system:kube-controller-manager"),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", freePort(t)), "--leader-elect=false",
		"--use-service-account-credentials=true", "--service-account-private-key-file="+cl.certs.saKey, "--root-ca-file="+cl.certs.caFile,
		// Else it creates /usr/libexec/kubernetes/kubelet-plugins/volume/exec on the host.
		"--flex-volume-plugin-dir="+filepath.Join(work, "flex"))

	cl.k = newKubelet(t, work, e, cl.ctrd)
	cl.k.kubeconfig = cl.certs.clientKubeconfig(t, "kubelet", a.base, "system:node:"+nodeName, "system:nodes")
	cl.k.args = []string{"--node-ip=127.0.0.1"}
	cl.k.start()
	step("kube-scheduler, kube-controller-manager and the kubelet started")

	// The node registers and becomes Ready.
	cl.apiserver.waitUntil(t, "node "+nodeName+" Ready", func() (bool, string) {
		var n corev1.Node
		if err := a.get("/api/v1/nodes/"+nodeName, &n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Sprintf("Ready %s: %s %s", c.Status, c.Reason, c.Message)
			}
		}
		return false, "no Ready condition"
	})
	// The controller manager makes the namespace's service account, which
	// pods need to be admitted.
	cl.cm.waitUntil(t, "the default service account", func() (bool, string) {
		err := a.get("/api/v1/namespaces/default/serviceaccounts/default", &corev1.ServiceAccount{})
		return err == nil, fmt.Sprint(err)
	})
	step("node Ready, default service account made")
	return cl
}

// rigPodSpec is the spec of the test's pods: busybox sleeping, on the
// host's network, as the pods' uid, with claims (each a pod resource
// claim the container uses).
func rigPodSpec(claims []corev1.PodResourceClaim) corev1.PodSpec {
	spec := corev1.PodSpec{
		HostNetwork:                   true,
		AutomountServiceAccountToken:  ptr(false),
		TerminationGracePeriodSeconds: ptr[int64](1),
		SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: ptr[int64](podUID), RunAsGroup: ptr[int64](podUID)},
		Containers: []corev1.Container{{
			Name: "main", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:         []string{"/bin/sh", "-c", "exec sleep 2147483647"},
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false)},
		}},
		ResourceClaims: claims,
	}
	for _, c := range claims {
		spec.Containers[0].Resources.Claims = append(spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c.Name})
	}
	return spec
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// checkDRA: resource.k8s.io/v1 with consumable capacity, the scheduler
// and the controller manager's claim controller on a hand-made
// ResourceSlice of the node: one device, 100 SM and 32Gi, shared. The
// kubelet takes an allocated claim to its DRA manager, which waits for the
// driver's plugin.
func checkDRA(t *testing.T, step func(string, ...any), cl *cluster) {
	t.Helper()
	a, scheduler, cm := cl.a, cl.scheduler, cl.cm
	q := resource.MustParse
	a.create(t, "/apis/resource.k8s.io/v1/deviceclasses", &resourcev1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: rigDeviceClass},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", rigDriver)},
		}}},
	})
	slice := &resourcev1.ResourceSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: "rig-" + nodeName},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   rigDriver,
			Pool:     resourcev1.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr(nodeName),
			Devices: []resourcev1.Device{{
				Name:       "gpu-0",
				Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"group": {StringValue: ptr("inference")}},
				Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
					"sm": {Value: q("100"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
						Default: ptr(q("100")), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: ptr(q("1")), Max: ptr(q("100")), Step: ptr(q("1"))}}},
					"memory": {Value: q("32Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
						Default: ptr(q("1Gi")), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: ptr(q("256Mi")), Step: ptr(q("256Mi"))}}},
				},
				AllowMultipleAllocations: ptr(true),
			}},
		},
	}
	a.create(t, "/apis/resource.k8s.io/v1/resourceslices", slice)
	// Read back as written: an API server without consumable capacity
	// drops the request policies and allowMultipleAllocations.
	var got resourcev1.ResourceSlice
	if err := a.get("/apis/resource.k8s.io/v1/resourceslices/"+slice.Name, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Devices) != 1 {
		t.Fatalf("the ResourceSlice read back has %d devices", len(got.Spec.Devices))
	}
	d := got.Spec.Devices[0]
	sm, mem := d.Capacity["sm"], d.Capacity["memory"]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || sm.Value.Cmp(q("100")) != 0 || mem.Value.Cmp(q("32Gi")) != 0 ||
		sm.RequestPolicy == nil || sm.RequestPolicy.ValidRange == nil || sm.RequestPolicy.ValidRange.Step == nil || sm.RequestPolicy.ValidRange.Step.Cmp(q("1")) != 0 ||
		mem.RequestPolicy == nil || mem.RequestPolicy.ValidRange == nil || mem.RequestPolicy.ValidRange.Step == nil || mem.RequestPolicy.ValidRange.Step.Cmp(q("256Mi")) != 0 {
		t.Fatalf("the ResourceSlice's device read back as %+v; want it shared with its capacity and request policies as written", d)
	}
	var class resourcev1.DeviceClass
	if err := a.get("/apis/resource.k8s.io/v1/deviceclasses/"+rigDeviceClass, &class); err != nil || len(class.Spec.Selectors) != 1 {
		t.Fatalf("the DeviceClass read back: %+v, %v", class.Spec, err)
	}
	step("DeviceClass and ResourceSlice with consumable capacity created and read back")

	request := func(sm, mem string) resourcev1.ResourceClaimSpec {
		return resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: rigDeviceClass,
			Capacity:        &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{"sm": q(sm), "memory": q(mem)}},
		}}}}}
	}
	claim := func(name, sm, mem string) {
		a.create(t, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", &resourcev1.ResourceClaim{
			TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       request(sm, mem),
		})
	}
	pod := func(name string, c corev1.PodResourceClaim) {
		a.create(t, "/api/v1/namespaces/default/pods", &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       rigPodSpec([]corev1.PodResourceClaim{c}),
		})
	}
	// allocated waits until the scheduler has bound pod to the node with
	// claim allocated from the slice's device, consuming sm and mem, and
	// reserved for the pod.
	allocated := func(pod, claim, sm, mem string) {
		t.Helper()
		scheduler.waitUntil(t, "pod "+pod+" scheduled with claim "+claim+" allocated", func() (bool, string) {
			var p corev1.Pod
			if err := a.get("/api/v1/namespaces/default/pods/"+pod, &p); err != nil {
				return false, err.Error()
			}
			if p.Spec.NodeName != nodeName {
				return false, fmt.Sprintf("pod %s not bound: %v", pod, p.Status.Conditions)
			}
			var c resourcev1.ResourceClaim
			if err := a.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"+claim, &c); err != nil {
				return false, err.Error()
			}
			al := c.Status.Allocation
			if al == nil || len(al.Devices.Results) != 1 {
				return false, fmt.Sprintf("claim %s: allocation %+v", claim, al)
			}
			r := al.Devices.Results[0]
			reserved := slices.ContainsFunc(c.Status.ReservedFor, func(ref resourcev1.ResourceClaimConsumerReference) bool {
				return ref.Resource == "pods" && ref.Name == pod && ref.UID == p.UID
			})
			gotSM, gotMem := r.ConsumedCapacity["sm"], r.ConsumedCapacity["memory"]
			ok := r.Driver == rigDriver && r.Pool == nodeName && r.Device == "gpu-0" && r.ShareID != nil &&
				gotSM.Cmp(q(sm)) == 0 && gotMem.Cmp(q(mem)) == 0 && reserved
			return ok, fmt.Sprintf("claim %s: result %+v (share %v), reserved for %+v", claim, r, r.ShareID, c.Status.ReservedFor)
		})
	}

	// A claim by name: 30 SM, 8Gi.
	claim("sm30", "30", "8Gi")
	pod("dra-sm30", corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr("sm30")})
	allocated("dra-sm30", "sm30", "30", "8Gi")
	step("claim sm30 allocated 30 SM and 8Gi of gpu-0, pod dra-sm30 scheduled")
	// The kubelet takes the pod's claim to its DRA manager, which waits
	// for the driver's kubelet plugin: none registers here.
	notRegistered := fmt.Sprintf("DRA driver %s is not registered", rigDriver)
	cl.k.d.wait("the kubelet waiting for "+rigDriver+"'s plugin to prepare pod dra-sm30's claim", func() (bool, string) {
		var evs corev1.EventList
		if err := a.get("/api/v1/namespaces/default/events?fieldSelector="+url.QueryEscape("involvedObject.name=dra-sm30"), &evs); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == "FailedPrepareDynamicResources" && strings.Contains(ev.Message, notRegistered) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprintf("events %q", seen)
	})
	step("the kubelet waits for the driver's plugin: %s", notRegistered)

	// A claim from a template: the controller manager makes the pod's
	// claim, the scheduler allocates it on the same device.
	a.create(t, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates", &resourcev1.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: "sm20", Namespace: "default"},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: request("20", "4Gi")},
	})
	pod("dra-template", corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr("sm20")})
	var generated string
	cm.waitUntil(t, "the template's claim made for pod dra-template", func() (bool, string) {
		var p corev1.Pod
		if err := a.get("/api/v1/namespaces/default/pods/dra-template", &p); err != nil {
			return false, err.Error()
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == "gpu" && s.ResourceClaimName != nil {
				generated = *s.ResourceClaimName
				return true, ""
			}
		}
		return false, fmt.Sprintf("resource claim statuses %+v", p.Status.ResourceClaimStatuses)
	})
	allocated("dra-template", generated, "20", "4Gi")
	step("claim %s made from template sm20, allocated 20 SM and 4Gi of gpu-0 beside sm30", generated)

	// 80 SM do not fit in the 50 left: the scheduler keeps the pod
	// Pending, its claim unallocated.
	claim("sm80", "80", "8Gi")
	pod("dra-sm80", corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr("sm80")})
	var pending corev1.Pod
	scheduler.waitUntil(t, "pod dra-sm80 unschedulable", func() (bool, string) {
		if err := a.get("/api/v1/namespaces/default/pods/dra-sm80", &pending); err != nil {
			return false, err.Error()
		}
		c := podCondition(&pending, corev1.PodScheduled)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable, fmt.Sprintf("conditions %+v", pending.Status.Conditions)
	})
	var c resourcev1.ResourceClaim
	if err := a.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/sm80", &c); err != nil {
		t.Fatal(err)
	}
	if msg := podCondition(&pending, corev1.PodScheduled).Message; !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod dra-sm80 unschedulable with %q; want the scheduler's DRA reason (cannot allocate all claims)", msg)
	}
	if pending.Spec.NodeName != "" || c.Status.Allocation != nil {
		t.Errorf("the claim that does not fit: pod on %q, allocation %+v; want neither", pending.Spec.NodeName, c.Status.Allocation)
	}
	step("pod dra-sm80 Pending: %s", podCondition(&pending, corev1.PodScheduled).Message)
}

// writeRigCDISpec writes the hand-written CDI spec into the CDI
// directory: device gpu0 of kind rig.mpsd.invalid/gpu sets an environment
// variable and binds a file of the work dir; the spec sets another
// variable for any of its devices.
func writeRigCDISpec(t *testing.T, work string) {
	t.Helper()
	src := filepath.Join(work, "cdi-mount")
	if err := os.WriteFile(src, []byte("gpu0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(`cdiVersion: "0.5.0"
kind: %s/gpu
devices:
  - name: gpu0
    containerEdits:
      env: ["MPSD_RIG_CDI_DEVICE=gpu0"]
      mounts:
        - hostPath: %s
          containerPath: /rig-cdi
          options: ["ro", "bind"]
containerEdits:
  env: ["MPSD_RIG_CDI_SPEC=1"]
`, rigDriver, src)
	if err := os.WriteFile(filepath.Join(cdiDir(work), "rig.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkCRICDI asks containerd through the CRI for a container with the
// hand-written spec's device (CreateContainer's CDIDevices, as the
// kubelet passes a prepared DRA claim's devices) and checks the
// container got the spec's environment and mount.
func checkCRICDI(t *testing.T, work string, e engines, c *containerd) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), engineWait)
	defer cancel()
	out := filepath.Join(work, "out", "cri-cdi")
	logs := filepath.Join(work, "cri-cdi-logs")
	for _, d := range []string{out, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sandbox := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "cri-cdi", Uid: "rig-cri-cdi", Namespace: "default"},
		LogDirectory: logs,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/" + e.CgroupRoot + "/cri-cdi",
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandbox})
	if err != nil {
		t.Fatalf("CRI RunPodSandbox: %v\n%s", err, tail(c.log, 3000))
	}
	defer func() {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("CRI StopPodSandbox: %v", err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("CRI RemovePodSandbox: %v", err)
		}
	}()
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sandbox,
		Config: &runtimeapi.ContainerConfig{
			Metadata:   &runtimeapi.ContainerMetadata{Name: "main"},
			Image:      &runtimeapi.ImageSpec{Image: busyboxImage},
			Command:    []string{"/bin/sh", "-c", "cat /rig-cdi > /out/mount; env > /out/env.tmp && mv /out/env.tmp /out/env"},
			Mounts:     []*runtimeapi.Mount{{ContainerPath: "/out", HostPath: out}},
			LogPath:    "main.log",
			CDIDevices: []*runtimeapi.CDIDevice{{Name: rigCDIDevice}},
		},
	})
	if err != nil {
		t.Fatalf("CRI CreateContainer with CDI device %s: %v\n%s", rigCDIDevice, err, tail(c.log, 3000))
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("CRI StartContainer: %v\n%s", err, tail(c.log, 3000))
	}
	c.wait("the CDI container's output", func() (bool, string) {
		_, err := os.Stat(filepath.Join(out, "env"))
		return err == nil, fmt.Sprint(err)
	})
	env, err := os.ReadFile(filepath.Join(out, "env"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(env), "\n")
	for _, want := range []string{"MPSD_RIG_CDI_DEVICE=gpu0", "MPSD_RIG_CDI_SPEC=1"} {
		if !slices.Contains(lines, want) {
			t.Errorf("the container asking for CDI device %s has no %s in its environment:\n%s", rigCDIDevice, want, env)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "mount")); err != nil || string(b) != "gpu0\n" {
		t.Errorf("the container asking for CDI device %s read %q (%v) from the spec's mount; want \"gpu0\\n\"", rigCDIDevice, b, err)
	}
}

// namespaceRSS sums the resident memory of the processes of the test's
// PID namespace (its /proc) by command name, largest first.
func namespaceRSS() string {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	byName := map[string]int64{}
	var total int64
	for _, d := range dirs {
		comm, err1 := os.ReadFile(filepath.Join(d, "comm"))
		status, err2 := os.ReadFile(filepath.Join(d, "status"))
		if err1 != nil || err2 != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				var kb int64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err == nil {
					byName[strings.TrimSpace(string(comm))] += kb
					total += kb
				}
			}
		}
	}
	names := slices.Collect(maps.Keys(byName))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(byName[b], byName[a]) })
	parts := []string{fmt.Sprintf("%d MiB in all", total>>10)}
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d MiB", n, byName[n]>>10))
	}
	return strings.Join(parts, ", ")
}

// create POSTs obj to the collection at path; anything but 201 Created
// fails the test.
func (a *apiClient) create(t *testing.T, path string, obj any) {
	t.Helper()
	if code, out := a.send(t, http.MethodPost, path, obj); code != http.StatusCreated {
		t.Fatalf("POST %s: %d %s", path, code, out)
	}
}

// remove DELETEs the object at path (in the foreground, so its dependents
// go first); anything but 200 or 202 fails the test.
func (a *apiClient) remove(t *testing.T, path string) {
	t.Helper()
	code, out, err := a.do(http.MethodDelete, path, "", []byte(`{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Foreground"}`))
	if err != nil || (code != http.StatusOK && code != http.StatusAccepted) {
		t.Fatalf("DELETE %s: %d %v %s", path, code, err, out)
	}
}

// get reads the object or list at path into v.
func (a *apiClient) get(path string, v any) error {
	code, b, err := a.do(http.MethodGet, path, "", nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, b)
	}
	return json.Unmarshal(b, v)
}
