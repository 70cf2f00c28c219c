package kubeinfo

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ResourcePrefix is the domain of mpsd's extended resources.
const ResourcePrefix = "mpsd.io/"

// HostRoot returns an error naming the first container of pod that may run
// as host uid 0: in a pod without a user namespace (hostUsers unset or
// true), a container (init, regular or ephemeral) whose effective
// runAsUser is 0, or which has neither runAsUser nor runAsNonRoot: true
// (its image's user decides, root by default), or which runs as non-root
// but may gain privileges (allowPrivilegeEscalation not false: a
// setuid-root program in its image would run as host root; false sets
// no_new_privs, and privileged containers cannot have it). Every container
// counts, not only the one holding the units: a container of the same pod
// may share its process namespace or volumes. nil means none can.
func HostRoot(pod *Pod) error {
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		return nil // a user namespace: the pod's uid 0 is not the host's
	}
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &PodSecurityContext{}
	}
	check := func(kind string, name string, sc *SecurityContext) error {
		uid, nonRoot := psc.RunAsUser, psc.RunAsNonRoot
		if sc != nil && sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc != nil && sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		switch {
		case nonRoot != nil && *nonRoot, uid != nil && *uid > 0:
			// Non-root (with runAsNonRoot the kubelet refuses to start
			// it as uid 0), unless a setuid program can make it root.
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				return fmt.Errorf("%s %q runs as a non-root uid but may gain root without a user namespace (allowPrivilegeEscalation is not false: a setuid-root program in its image would be host root to the shared MPS daemon); set allowPrivilegeEscalation: false, or hostUsers: false", kind, name)
			}
			return nil
		case uid != nil:
			return fmt.Errorf("%s %q runs as uid 0 without a user namespace (runAsUser: 0), which is host root to the shared MPS daemon", kind, name)
		}
		return fmt.Errorf("%s %q may run as uid 0 without a user namespace: neither runAsUser nor runAsNonRoot is set, so its image's user decides; set runAsNonRoot: true or a non-zero runAsUser, or hostUsers: false", kind, name)
	}
	for _, c := range pod.Spec.InitContainers {
		if err := check("init container", c.Name, c.SecurityContext); err != nil {
			return err
		}
	}
	for _, c := range pod.Spec.Containers {
		if err := check("container", c.Name, c.SecurityContext); err != nil {
			return err
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if err := check("ephemeral container", c.Name, c.SecurityContext); err != nil {
			return err
		}
	}
	return nil
}

// AsksMPSD reports whether a container of pod asks for an mpsd.io
// resource.
func AsksMPSD(pod *Pod) bool {
	asks := func(rr ResourceRequirements) bool {
		for _, l := range []map[string]json.RawMessage{rr.Limits, rr.Requests} {
			for k := range l {
				if strings.HasPrefix(string(k), ResourcePrefix) {
					return true
				}
			}
		}
		return false
	}
	for _, c := range pod.Spec.InitContainers {
		if asks(c.Resources) {
			return true
		}
	}
	for _, c := range pod.Spec.Containers {
		if asks(c.Resources) {
			return true
		}
	}
	return false
}
