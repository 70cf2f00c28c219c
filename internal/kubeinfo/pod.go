package kubeinfo

import (
	"encoding/json"
	"fmt"
)

// Pod is what the root check reads of a pod: its name and the parts of
// its spec that say which uid its containers may run as and what they
// ask for, decoded from the API server's JSON (the JSON of k8s.io/api's
// core/v1 Pod, whose names these fields keep). The core API's Go types
// are not used: linked into mpsd they would add megabytes to every mpsd's
// memory for the few fields read here.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     PodSpec    `json:"spec"`
}

// ObjectMeta is a pod's name and namespace.
type ObjectMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// PodSpec is the part of a pod's spec the check reads.
type PodSpec struct {
	// HostUsers false: the pod runs in a user namespace.
	HostUsers           *bool               `json:"hostUsers,omitempty"`
	SecurityContext     *PodSecurityContext `json:"securityContext,omitempty"`
	InitContainers      []Container         `json:"initContainers,omitempty"`
	Containers          []Container         `json:"containers,omitempty"`
	EphemeralContainers []Container         `json:"ephemeralContainers,omitempty"`
}

// PodSecurityContext is the pod-level defaults of its containers' uids.
type PodSecurityContext struct {
	RunAsUser    *int64 `json:"runAsUser,omitempty"`
	RunAsNonRoot *bool  `json:"runAsNonRoot,omitempty"`
}

// Container is one container (init, regular or ephemeral).
type Container struct {
	Name            string               `json:"name"`
	SecurityContext *SecurityContext     `json:"securityContext,omitempty"`
	Resources       ResourceRequirements `json:"resources,omitempty"`
}

// SecurityContext is a container's uid settings.
type SecurityContext struct {
	RunAsUser                *int64 `json:"runAsUser,omitempty"`
	RunAsNonRoot             *bool  `json:"runAsNonRoot,omitempty"`
	AllowPrivilegeEscalation *bool  `json:"allowPrivilegeEscalation,omitempty"`
}

// ResourceRequirements is what a container asks for, by resource name
// (the quantities are not read).
type ResourceRequirements struct {
	Limits   map[string]json.RawMessage `json:"limits,omitempty"`
	Requests map[string]json.RawMessage `json:"requests,omitempty"`
}

// DecodePod decodes a pod's JSON, as the API server sends it (or as
// k8s.io/api's core/v1 Pod marshals).
func DecodePod(b []byte) (*Pod, error) {
	var p Pod
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("kubeinfo: decode a pod: %w", err)
	}
	return &p, nil
}
