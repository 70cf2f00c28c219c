package kubernetes

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/ociimage"
	corev1 "k8s.io/api/core/v1"
)

// The kubelet end-to-end test runs mpsd from its image, make
// package-image's $MPSD_DIST_DIR/mpsd-image.tar imported into containerd
// with ctr (never pulled), as a static pod of the kubelet shaped as the
// example DaemonSet's (mpsd-daemonset.yaml): hostPID, hostNetwork,
// privileged, the image's entrypoint (/usr/bin/mpsd) given only
// arguments, and hostPath volumes at the paths mpsd is told: the test's
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
	// restarts is the container's restart count in the current run.
	restarts int32
	// id is the current run's container id.
	id string
}

// podName is the kubelet's name of mpsd's static pod.
func (p *mpsdPod) podName() string { return mpsdPodName + "-" + nodeName }

// manifest is the static pod: the example DaemonSet's pod as the test's
// node runs it, mpsd's arguments given to the image's entrypoint.
func (p *mpsdPod) manifest(args []string) string {
	argv, _ := json.Marshal(args)
	var mounts, volumes strings.Builder
	for i, path := range p.mounts {
		fmt.Fprintf(&mounts, "        - name: v%d\n          mountPath: %s\n", i, path)
		if path == p.propagate {
			mounts.WriteString("          mountPropagation: HostToContainer\n")
		}
		fmt.Fprintf(&volumes, "    - name: v%d\n      hostPath:\n        path: %s\n        type: Directory\n", i, path)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  hostNetwork: true
  hostPID: true
  restartPolicy: Always
  terminationGracePeriodSeconds: 30
  containers:
    - name: %s
      image: %s
      imagePullPolicy: Never
      args: %s
      securityContext:
        privileged: true
      volumeMounts:
%s  volumes:
%s`, mpsdPodName, mpsdPodNamespace, mpsdContainer, p.image.Name, argv, mounts.String(), volumes.String())
}

// start writes the static pod (renamed into place) and waits until its
// container runs the imported image; m's log becomes the container's.
func (p *mpsdPod) start(m *mpsdProc) {
	m.t.Helper()
	args := append([]string{"--config", m.cfg, "--simulate", "--log-level", "debug"}, m.args...)
	staged := filepath.Join(p.k.work, "staging", mpsdPodName+".yaml")
	if err := os.WriteFile(staged, []byte(p.manifest(args)), 0o644); err != nil {
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
