package kubernetes

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/ociimage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The kubelet end-to-end test runs mpsd from its image, make
// package-image's $MPSD_DIST_DIR/mpsd-image.tar imported into containerd
// with ctr (never pulled), as a static pod of the kubelet made from the
// example DaemonSet's pod template (mpsd-daemonset.yaml; mpsdPod.manifest
// says what it changes): hostPID, privileged, its memory limit,
// environment and readiness probe, the image's entrypoint (/usr/bin/mpsd)
// given the test's arguments, hostNetwork (the node has no pod network),
// the DaemonSet's host mounts of the node's /etc/passwd and /etc/group,
// and hostPath volumes at the paths mpsd is told: the test's
// work directory (its config, run_dir, state and log dirs, the kubelet's
// pod-resources socket, containerd's socket), with HostToContainer
// propagation for the private /dev/shm mpsd mounts under run_dir in the
// host's mount namespace; the kubelet's device-plugins directory; the
// cgroup file system (a container's own shows only its own cgroups: mpsd
// binds a lease to another container's through them); and the
// MPS emulator's directory (--simulate: there is no GPU), whose programs
// run on the image's C library (the host's libc6, the one they were
// linked with). mpsctl talks to it from the host through the socket.

const (
	// distDirEnv is where make package-image wrote the image archive.
	distDirEnv = "MPSD_DIST_DIR"
	// imageArchive is the image archive's name in it.
	imageArchive = "mpsd-image.tar"
	// mpsdPodNamespace and mpsdPodName name mpsd's static pod; the kubelet
	// calls it mpsdPodName-nodeName.
	mpsdPodNamespace = "mpsd"
	mpsdPodName      = "mpsd"
	// mpsdContainer is its container's name.
	mpsdContainer = "mpsd"
)

// findImage is the image archive's path, or why there is none.
func findImage() (string, error) {
	dir := os.Getenv(distDirEnv)
	if dir == "" {
		return "", fmt.Errorf("no $%s (make package-image writes %s there; make test sets it)", distDirEnv, imageArchive)
	}
	p := filepath.Join(dir, imageArchive)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no image archive (make package-image): %w", err)
	}
	return p, nil
}

// mpsdImage is the imported image: its name and manifest and config
// digests as the archive's index.json and manifest give them, and the
// commit its config's revision label names.
type mpsdImage struct {
	Name, Manifest, Config, Revision string
}

// readImageArchive reads the name, digests and revision of the archive's
// image.
func readImageArchive(path string) (mpsdImage, error) {
	f, err := os.Open(path)
	if err != nil {
		return mpsdImage{}, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return mpsdImage{}, fmt.Errorf("%s: %w", path, err)
		}
		if h.Name == "index.json" || (strings.HasPrefix(h.Name, "blobs/sha256/") && h.Size < 1<<16) {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				return mpsdImage{}, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		return mpsdImage{}, fmt.Errorf("%s: index.json %s: %v; want one image", path, files["index.json"], err)
	}
	img := mpsdImage{Name: index.Manifests[0].Annotations["io.containerd.image.name"], Manifest: index.Manifests[0].Digest}
	var manifest struct{ Config struct{ Digest string } }
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(img.Manifest, "sha256:")], &manifest); err != nil {
		return mpsdImage{}, fmt.Errorf("%s: the manifest %s: %w", path, img.Manifest, err)
	}
	img.Config = manifest.Config.Digest
	var config struct {
		Config struct{ Labels map[string]string }
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(img.Config, "sha256:")], &config); err != nil {
		return mpsdImage{}, fmt.Errorf("%s: the config %s: %w", path, img.Config, err)
	}
	img.Revision = config.Config.Labels["org.opencontainers.image.revision"]
	if !strings.HasPrefix(img.Name, "docker.io/library/mpsd:") || img.Config == "" {
		return mpsdImage{}, fmt.Errorf("%s: image %+v; want docker.io/library/mpsd:<version> with a config", path, img)
	}
	return img, nil
}

// stampNow is what hack/ldflags.sh stamps now, from the repository's
// root: the version and commit make build and make package-image use.
func stampNow() (ociimage.Stamp, error) {
	cmd := exec.Command("hack/ldflags.sh")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		return ociimage.Stamp{}, fmt.Errorf("hack/ldflags.sh: %w", err)
	}
	return ociimage.ParseLdflags(string(out))
}

// checkImageFresh says whether the archive's image is the one make
// package-image writes from this checkout now: its name is
// ociimage.FullName of the stamped version and its revision label the
// stamped commit. Else the test would run an older mpsd than the one
// it describes, without notice.
func checkImageFresh(path string, img mpsdImage, now ociimage.Stamp) error {
	if img.Name != ociimage.FullName(now.Version) || img.Revision != now.Commit {
		return fmt.Errorf("%s is stale: run make package-image (it holds %s of commit %q; hack/ldflags.sh stamps %s of commit %q)",
			path, img.Name, img.Revision, ociimage.FullName(now.Version), now.Commit)
	}
	return nil
}

// importMPSDImage imports the image archive into the CRI's namespace, as
// an operator does (ctr -n k8s.io images import), and checks containerd
// knows it by its name at the archive's digest.
func importMPSDImage(t *testing.T, e engines, c *containerd) mpsdImage {
	t.Helper()
	img, err := readImageArchive(e.Image)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(e.Ctr, "--address", c.socket, "-n", "k8s.io", "images", "import", e.Image).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", e.Image, err, out)
	}
	out, err = exec.Command(e.Ctr, "--address", c.socket, "-n", "k8s.io", "images", "ls").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == img.Name && f[2] == img.Manifest {
			return img
		}
	}
	t.Fatalf("image %s at %s not imported: %v\n%s", img.Name, img.Manifest, err, out)
	return img
}

// mpsdPod is mpsd run by the kubelet as a static pod from its image.
type mpsdPod struct {
	k     *kubelet
	image mpsdImage
	// mounts are the host paths bound at the same path into the
	// container; propagate, the one that receives the host's mounts.
	mounts    []string
	propagate string
	// metrics is mpsd's metrics address, which the readiness probe asks.
	metrics string
	// restarts is the container's restart count in the current run.
	restarts int32
	// id is the current run's container id.
	id string
}

// podName is the kubelet's name of mpsd's static pod.
func (p *mpsdPod) podName() string { return mpsdPodName + "-" + nodeName }

// daemonSetPodSpec is the pod template of the example DaemonSet
// (mpsd-daemonset.yaml), decoded as the manifests' test decodes it.
func daemonSetPodSpec() (corev1.PodTemplateSpec, error) {
	src, err := os.ReadFile("mpsd-daemonset.yaml")
	if err != nil {
		return corev1.PodTemplateSpec{}, err
	}
	o, problems := decode(map[string][]byte{"mpsd-daemonset.yaml": src})
	if len(problems) > 0 || len(o.daemonSets) != 1 {
		return corev1.PodTemplateSpec{}, fmt.Errorf("mpsd-daemonset.yaml: %d DaemonSets: %v", len(o.daemonSets), problems)
	}
	return *o.daemonSets[0].Spec.Template.DeepCopy(), nil
}

// manifest is the static pod: the example DaemonSet's pod template as
// the test's node runs it. What the node lacks goes: no API server (so
// no service account, ConfigMap or node labels to select on), no pod
// network (hostNetwork), no NVIDIA runtime (--simulate). The image is the
// imported one, never pulled; the entrypoint is the DaemonSet's, given
// the test's arguments; the DaemonSet's host mounts stay where the test
// mounts the same host path, and its other mounts (under /run, /var,
// /etc/mpsd) are the test's work directory; the readiness probe asks the
// test's metrics address. Everything else (hostPID, privileged, the
// memory limit, the environment, tolerations, the priority class, the
// grace period) is the DaemonSet's.
func (p *mpsdPod) manifest(args []string) (string, error) {
	tmpl, err := daemonSetPodSpec()
	if err != nil {
		return "", err
	}
	spec := tmpl.Spec
	if len(spec.Containers) != 1 || len(spec.Containers[0].Command) == 0 {
		return "", fmt.Errorf("mpsd-daemonset.yaml: want one container with a command, have %+v", spec.Containers)
	}
	spec.HostNetwork = true
	spec.NodeSelector, spec.RuntimeClassName, spec.ServiceAccountName = nil, nil, ""
	spec.RestartPolicy = corev1.RestartPolicyAlways
	c := &spec.Containers[0]
	c.Name = mpsdContainer
	c.Image, c.ImagePullPolicy = p.image.Name, corev1.PullNever
	c.Command, c.Args = c.Command[:1], args
	// The DaemonSet's mounts of the host paths the test mounts too, and
	// of host files (the user database), stay.
	hostPaths := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath
		}
	}
	keptVolumes := map[string]bool{}
	covered := map[string]bool{}
	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		hp := hostPaths[m.Name]
		if hp == nil || hp.Path != m.MountPath {
			continue
		}
		if slices.Contains(p.mounts, hp.Path) || (hp.Type != nil && *hp.Type == corev1.HostPathFile) {
			mounts, keptVolumes[m.Name], covered[hp.Path] = append(mounts, m), true, true
		}
	}
	var volumes []corev1.Volume
	for _, v := range spec.Volumes {
		if keptVolumes[v.Name] {
			volumes = append(volumes, v)
		}
	}
	dir := corev1.HostPathDirectory
	for i, path := range p.mounts {
		if covered[path] {
			continue
		}
		name := fmt.Sprintf("test-%d", i)
		m := corev1.VolumeMount{Name: name, MountPath: path}
		if path == p.propagate {
			prop := corev1.MountPropagationHostToContainer
			m.MountPropagation = &prop
		}
		mounts = append(mounts, m)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &dir}}})
	}
	c.VolumeMounts, spec.Volumes = mounts, volumes
	if p.metrics != "" {
		host, port, err := net.SplitHostPort(p.metrics)
		if err != nil {
			return "", err
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return "", err
		}
		for i := range c.Ports {
			if c.Ports[i].Name == "metrics" {
				c.Ports[i].ContainerPort = int32(n)
			}
		}
		if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
			c.ReadinessProbe.HTTPGet.Host = host
		}
	}
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: mpsdPodName, Namespace: mpsdPodNamespace, Labels: tmpl.Labels},
		Spec:       spec,
	}
	b, err := yaml.Marshal(&pod)
	return string(b), err
}

// start writes the static pod (renamed into place) and waits until its
// container runs the imported image; m's log becomes the container's.
func (p *mpsdPod) start(m *mpsdProc) {
	m.t.Helper()
	args := append([]string{"--config", m.cfg, "--simulate", "--log-level", "debug"}, m.args...)
	staged := filepath.Join(p.k.work, "staging", mpsdPodName+".yaml")
	manifest, err := p.manifest(args)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(staged, []byte(manifest), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(staged, filepath.Join(p.k.manifest, mpsdPodName+".yaml")); err != nil {
		m.t.Fatal(err)
	}
	p.waitRun(m, 0)
}

// waitRun waits until the container runs its restarts'th restart, checks
// it runs the imported image, and points m's log at that run's log file.
func (p *mpsdPod) waitRun(m *mpsdProc, restarts int32) {
	m.t.Helper()
	pod := p.k.waitPod(p.podName(), fmt.Sprintf("running mpsd (restart %d)", restarts), func(pod *corev1.Pod) bool {
		if len(pod.Status.ContainerStatuses) != 1 {
			return false
		}
		if why := p.failed(pod, restarts); why != "" {
			m.t.Fatal(why)
		}
		cs := pod.Status.ContainerStatuses[0]
		return cs.State.Running != nil && cs.RestartCount == restarts
	})
	cs := pod.Status.ContainerStatuses[0]
	// The container runs the image imported from the archive: by name,
	// and by digest (containerd's CRI reports the manifest's digest as
	// the image's repo digest, else the config's as its id).
	if cs.Image != p.image.Name || (!strings.HasSuffix(cs.ImageID, "@"+p.image.Manifest) && cs.ImageID != p.image.Config) {
		m.t.Errorf("mpsd's container runs image %s (%s); want the imported %s (%s, config %s)", cs.Image, cs.ImageID, p.image.Name, p.image.Manifest, p.image.Config)
	}
	p.restarts, p.id = restarts, strings.TrimPrefix(cs.ContainerID, "containerd://")
	m.log, m.logStart = p.logPath(pod, restarts), 0
}

// failed says how mpsd's container failed in or before its restarts'th
// run, or "" while it has not: an image the runtime cannot run (no
// entrypoint, a program that does not execute) or an mpsd that exits
// fails the test at once, not at a wait's deadline. (A back-off after a
// failed run shows as a restart count past restarts.)
func (p *mpsdPod) failed(pod *corev1.Pod, restarts int32) string {
	if len(pod.Status.ContainerStatuses) != 1 {
		return ""
	}
	cs := pod.Status.ContainerStatuses[0]
	switch {
	case cs.State.Terminated != nil && cs.RestartCount == restarts:
		return fmt.Sprintf("mpsd's container from %s ended: %+v\n%s", p.image.Name, cs.State.Terminated, tail(p.logPath(pod, cs.RestartCount), 4000))
	case cs.RestartCount > restarts:
		return fmt.Sprintf("mpsd's container from %s restarted %d times, want %d: its last run %+v\n%s", p.image.Name, cs.RestartCount, restarts, cs.LastTerminationState.Terminated, tail(p.logPath(pod, restarts), 4000))
	case cs.State.Waiting != nil && slices.Contains([]string{"CreateContainerError", "RunContainerError", "StartError", "ErrImageNeverPull", "CreateContainerConfigError"}, cs.State.Waiting.Reason):
		return fmt.Sprintf("mpsd's container from %s does not run: %s: %s", p.image.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
	}
	return ""
}

// check fails the test when mpsd's container failed in its current run
// (mpsdProc.waitStatus asks while mpsd does not answer).
func (p *mpsdPod) check(t *testing.T) {
	t.Helper()
	pods, err := p.k.pods()
	if err != nil {
		return
	}
	for i := range pods {
		if pods[i].Name == p.podName() {
			if why := p.failed(&pods[i], p.restarts); why != "" {
				t.Fatal(why)
			}
		}
	}
}

// logPath is the kubelet's log file of the container's restarts'th run
// (<pod logs>/<namespace>_<pod>_<uid>/<container>/<restarts>.log).
func (p *mpsdPod) logPath(pod *corev1.Pod, restarts int32) string {
	return filepath.Join(p.k.work, "pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), mpsdContainer, fmt.Sprintf("%d.log", restarts))
}

// ctr runs ctr on containerd's CRI namespace.
func (p *mpsdPod) ctr(args ...string) (string, error) {
	out, err := exec.Command(p.k.e.Ctr, append([]string{"--address", p.k.ctrd, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// restart sends the container's mpsd SIGTERM, as the kubelet does to
// stop it; mpsd exits 0 and the kubelet starts the container again
// (restartPolicy: Always).
func (p *mpsdPod) restart(m *mpsdProc) {
	m.t.Helper()
	if out, err := p.ctr("tasks", "kill", "--signal", "SIGTERM", p.id); err != nil {
		m.t.Fatalf("ctr tasks kill %s: %v\n%s", p.id, err, out)
	}
	old := p.restarts
	p.waitRun(m, old+1)
	pods, err := p.k.pods()
	if err != nil {
		m.t.Fatal(err)
	}
	for _, pod := range pods {
		if pod.Name == p.podName() {
			if last := pod.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.ExitCode != 0 {
				m.t.Errorf("mpsd's container's run %d ended %+v; want exit status 0 after SIGTERM", old, last)
			}
		}
	}
}

// shutdown is `mpsctl shutdown` on the static pod's mpsd: the kubelet is
// stopped first, else it would start the container again (restartPolicy:
// Always) and the new mpsd its instances; the container's task stops.
func (p *mpsdPod) shutdown(m *mpsdProc) {
	m.t.Helper()
	p.k.stop()
	if out, err := exec.Command(filepath.Join(m.bin, "mpsctl"), "--socket", m.socket, "shutdown").CombinedOutput(); err != nil {
		m.t.Fatalf("mpsctl shutdown: %v\n%s", err, out)
	}
	p.k.d.wait("mpsd's container stopped after mpsctl shutdown", func() (bool, string) {
		out, err := p.ctr("tasks", "ls")
		if err != nil {
			return false, fmt.Sprintf("ctr tasks ls: %v: %s", err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == p.id && f[2] == "RUNNING" {
				return false, line
			}
		}
		return true, ""
	})
}

// TestImageArchiveStale: an image archive of another version or commit
// than hack/ldflags.sh stamps now is refused, saying to build it again;
// this checkout's is taken.
func TestImageArchiveStale(t *testing.T) {
	const version, commit = "v1.2.0-3-g0123456789ab", "0123456789abcdef0123456789abcdef01234567"
	created := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	img, err := ociimage.Image(ociimage.Spec{Version: version, Revision: commit, Created: created, Arch: "amd64",
		Programs: map[string][]byte{"mpsd": []byte("mpsd"), "mpsctl": []byte("mpsctl"), "mps-launch": []byte("mps-launch")}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), imageArchive)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.WriteArchive(f, img, version, created); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := readImageArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		now   ociimage.Stamp
		stale bool
	}{
		{"this checkout's", ociimage.Stamp{Version: version, Commit: commit}, false},
		{"another version", ociimage.Stamp{Version: "v1.2.0-4-gabcdefabcdef", Commit: commit}, true},
		{"another commit", ociimage.Stamp{Version: version, Commit: "abcdefabcdefabcdefabcdefabcdefabcdefabcd"}, true},
		{"a dirty tree", ociimage.Stamp{Version: version + "-dirty", Commit: commit}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkImageFresh(path, got, tc.now)
			if tc.stale != (err != nil) {
				t.Fatalf("checkImageFresh: %v; want stale %v", err, tc.stale)
			}
			if want := path + " is stale: run make package-image"; err != nil && !strings.Contains(err.Error(), want) {
				t.Errorf("checkImageFresh: %v; want %q", err, want)
			}
		})
	}
}

// TestMPSDStaticPod: the e2e test's static pod is the example DaemonSet's
// pod, changed only where the test's node differs: what the DaemonSet
// sets (hostPID, privileged, the memory limit, the environment, the
// readiness probe, the user database's mounts, the entrypoint) is there.
func TestMPSDStaticPod(t *testing.T) {
	tmpl, err := daemonSetPodSpec()
	if err != nil {
		t.Fatal(err)
	}
	want := tmpl.Spec.Containers[0]
	p := &mpsdPod{image: mpsdImage{Name: "docker.io/library/mpsd:v1.2.0"}, mounts: []string{"/work", "/var/lib/kubelet/device-plugins", "/sys/fs/cgroup", "/emu"},
		propagate: "/work", metrics: "127.0.0.1:19486"}
	text, err := p.manifest([]string{"--config", "/work/m/mpsd.yaml", "--simulate"})
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(text), &pod); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	s := pod.Spec
	c := s.Containers[0]
	if !s.HostPID || !s.HostNetwork || s.ServiceAccountName != "" || s.RuntimeClassName != nil || s.NodeSelector != nil || s.PriorityClassName != tmpl.Spec.PriorityClassName {
		t.Errorf("pod spec %+v; want the DaemonSet's hostPID and priority class, hostNetwork, no service account, runtime class or node selector", s)
	}
	if c.Image != p.image.Name || c.ImagePullPolicy != corev1.PullNever || !slices.Equal(c.Command, []string{ociimage.Entrypoint}) || !slices.Equal(c.Args, []string{"--config", "/work/m/mpsd.yaml", "--simulate"}) {
		t.Errorf("container runs %s (%s) %q %q; want the imported image's entrypoint with the test's arguments", c.Image, c.ImagePullPolicy, c.Command, c.Args)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged ||
		!c.Resources.Limits.Memory().Equal(*want.Resources.Limits.Memory()) || !slices.Equal(c.Env, want.Env) {
		t.Errorf("container %+v; want the DaemonSet's privileged, memory limit %v and environment %v", c, want.Resources.Limits.Memory(), want.Env)
	}
	if pr := c.ReadinessProbe; pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/readyz" || pr.HTTPGet.Host != "127.0.0.1" || len(c.Ports) != 1 || c.Ports[0].ContainerPort != 19486 {
		t.Errorf("readiness probe %+v ports %+v; want the DaemonSet's /readyz at the test's metrics address", pr, c.Ports)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, path := range append([]string{"/etc/passwd", "/etc/group"}, p.mounts...) {
		if _, ok := mounts[path]; !ok {
			t.Errorf("no mount at %s: %+v", path, c.VolumeMounts)
		}
	}
	if m := mounts["/work"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("the work directory's mount %+v; want HostToContainer", m)
	}
	if len(c.VolumeMounts) != len(s.Volumes) || len(c.VolumeMounts) != len(p.mounts)+2 {
		t.Errorf("mounts %+v of volumes %+v; want the test's %d and the user database's 2", c.VolumeMounts, s.Volumes, len(p.mounts))
	}
}
