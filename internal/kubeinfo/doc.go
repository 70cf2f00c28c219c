// Package kubeinfo answers, from facts the kubelet and the Kubernetes API
// server give, whether a container that holds mpsd's device-plugin units
// would run as host root, so that the device plugin can refuse to start it
// (PreStartContainer) before it can reach a shared MPS daemon's control
// socket; and, from the kubelet's PodResources API and the container
// runtime's CRI (Pods), which running container holds which units and a
// process of it, so that mpsd can hold the container's processes to the
// lease of those units.
//
// Which pod and container hold the units comes from the kubelet's
// PodResources API (a unix socket only root reaches); the pod's spec from
// the API server, with the node's credentials (a kubeconfig) or a service
// account. Nothing the pod writes (its environment, /proc of its own
// processes) decides the answer. The kubelet asks the plugin before it
// creates the container, so the container's runtime spec does not exist
// yet: the spec the kubelet starts it from is the fact to judge.
//
// The rule (HostRoot) is the one examples/kubernetes/mpsd-pod-policy.yaml
// enforces at admission: a pod that asks for an mpsd.io resource must run
// in a user namespace (hostUsers: false) or have every container run as a
// non-root uid (runAsUser > 0, or runAsNonRoot: true, which the kubelet
// enforces against the image's user), at the container's level or else
// the pod's, without a way to gain root (allowPrivilegeEscalation: false,
// so a setuid-root program in the image stays unprivileged).
package kubeinfo
