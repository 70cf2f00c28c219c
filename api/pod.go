package api

import (
	"fmt"
	"io"
	"net/url"
	"strings"
)

// podSuffix ends PodPath.
const podSuffix = "/pod"

// PodPath is where the kubelet device plugin posts a BindPodRequest for
// lease id.
func PodPath(id string) string {
	return PathLeases + "/" + url.PathEscape(id) + podSuffix
}

// Bounds of PodContainer's fields.
const (
	// MaxPodNameLen bounds a namespace, pod or container name (a DNS
	// subdomain is at most 253 characters).
	MaxPodNameLen = 253
	// MinContainerIDLen and MaxContainerIDLen bound a container id: the
	// runtime's own (containerd's and CRI-O's are 64 hexadecimal digits),
	// long enough that it names one container's cgroup and no other.
	MinContainerIDLen = 12
	MaxContainerIDLen = 128
)

// PodContainer names the Kubernetes container whose processes are a
// device-plugin lease's: its pod, its name and the runtime's id of the
// running container (a restarted container has a new one).
type PodContainer struct {
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	Container   string `json:"container"`
	ContainerID string `json:"container_id"`
}

func (c PodContainer) String() string {
	return fmt.Sprintf("pod %s/%s container %s", c.Namespace, c.Pod, c.Container)
}

// BindPodRequest is the body of POST /v1/leases/{id}/pod: the kubelet
// device plugin (root, holding the lease) tells mpsd which running
// container holds the lease's units, as the kubelet's PodResources API
// and the container runtime say. PID is a process of that container as
// the runtime reports it (its init); mpsd reads the container's cgroups
// from the kernel through it, and takes only the cgroups named after
// ContainerID. From then on the processes of those cgroups are the
// lease's: their device memory is held to the lease's, reconciliation
// joins them, and a lease over its memory for memory_grace ends them.
type BindPodRequest struct {
	PodContainer
	PID int `json:"pid"`
}

// Validate checks the names and the id's form and that PID can name
// another process.
func (b BindPodRequest) Validate() error {
	for _, f := range []struct{ what, v string }{{"namespace", b.Namespace}, {"pod", b.Pod}, {"container", b.Container}} {
		if f.v == "" || len(f.v) > MaxPodNameLen || strings.ContainsFunc(f.v, func(r rune) bool { return r <= ' ' || r > '~' || r == '/' }) {
			return fmt.Errorf("%w: pod binding: %s %q: want 1 to %d printable ASCII characters without '/' or spaces", ErrInvalid, f.what, f.v, MaxPodNameLen)
		}
	}
	if !ValidContainerID(b.ContainerID) {
		return fmt.Errorf("%w: pod binding: container id %q: want %d to %d letters or digits", ErrInvalid, b.ContainerID, MinContainerIDLen, MaxContainerIDLen)
	}
	if b.PID <= 1 {
		return fmt.Errorf("%w: pod binding: pid %d is not a container's process", ErrInvalid, b.PID)
	}
	return nil
}

// ValidContainerID reports whether id can be a runtime's container id:
// MinContainerIDLen to MaxContainerIDLen ASCII letters or digits.
func ValidContainerID(id string) bool {
	if len(id) < MinContainerIDLen || len(id) > MaxContainerIDLen {
		return false
	}
	for _, r := range id {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return false
		}
	}
	return true
}

// DecodeBindPodRequest reads one BindPodRequest from r as strictly as
// DecodeLeaseRequest.
func DecodeBindPodRequest(r io.Reader) (BindPodRequest, error) {
	var b BindPodRequest
	if err := decodeStrict(r, MaxRequestBytes, "pod binding", &b); err != nil {
		return BindPodRequest{}, err
	}
	if err := b.Validate(); err != nil {
		return BindPodRequest{}, err
	}
	return b, nil
}
