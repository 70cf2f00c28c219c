// Package deviceplugin is mpsd's Kubernetes device plugin (`mpsd
// --kubelet-device-plugin`), built on the kubelet's device-plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
//
// It owns the kubelet's side of a node: one extended resource per group,
// mpsd.io/<group>-sm, counted in SM-percent units (a device per percent of
// each instance's sm_percent budget, ID <group>-gpu<index>-sm<n>), served
// by one DevicePlugin gRPC service per group on its own socket in the
// kubelet's directory and registered through kubelet.sock, again whenever
// the kubelet restarts (it deletes the plugins' sockets and creates
// kubelet.sock anew; the directory is watched with fsnotify).
//
//   - ListAndWatch: a unit is Healthy while its instance is ready and
//     Unhealthy in any other state (starting, recovering, quarantined,
//     draining, drained, retiring, or one this plugin does not know):
//     the kubelet places no new pod on it; running pods go on. mpsd's
//     status is polled (Options.PollInterval, and at once after a lease
//     event) and a list is sent only when it changed.
//   - GetPreferredAllocation packs a container's units onto one GPU.
//   - Allocate creates a lease on mpsd for each container: SM = its number
//     of units, memory in the same proportion of the group's budget, the
//     instance's GPUs (gpu_select), no wait and no requeue, job id
//     "k8s:sm=<units>". The container gets the lease's MPS environment,
//     NVIDIA_VISIBLE_DEVICES, the instance's pipe directory with its log
//     FIFO and pid file masked by /dev/null, the instance's private
//     shared-memory directory (mps.ShmDirFor: a tmpfs of its own, bounded
//     by the group's shm_size; mpsd runs the daemons of the groups it
//     serves to the kubelet with it as /dev/shm, mps.PrivateShm) as
//     /dev/shm, never the host's nor a plain directory, and on a host with NVIDIA's driver the
//     device nodes. A request that does not fit fails with mpsd's reason.
//   - PreStartContainer (asked for when Options.PodCheck is set, as mpsd
//     does unless --kubelet-allow-host-root): before the kubelet creates
//     and starts a container holding units, the check finds the container
//     through the kubelet's PodResources API and reads its pod's spec from
//     the API server (internal/kubeinfo); a container that would run as
//     host uid 0 (no user namespace, and runAsUser 0, or unset without
//     runAsNonRoot, or allowPrivilegeEscalation not false) is refused, and
//     so is one that cannot be checked: host
//     root is root to the shared MPS daemon, whose control socket a pod
//     reaches through its read-only mount.
//   - Pods (Options.Pods, which mpsd sets: kubeinfo.Pods): every poll, the
//     container holding each allocation's units (the kubelet's PodResources
//     API) and, from the container runtime's CRI, its id and first
//     process; the plugin binds the allocation's lease to that container
//     on mpsd (POST /v1/leases/{id}/pod) whenever mpsd's status shows it
//     bound to none or another. mpsd then reads the container's cgroup
//     from the kernel and holds its processes to the lease as it holds an
//     mps-launch lease's: their device memory past memory_grace ends the
//     container's CUDA processes and the lease (the plugin logs the pod
//     and the container, then leases the units again for the container
//     the kubelet restarts). Nothing the pod writes decides which
//     processes are the lease's.
//
// The lease's stream is held while the allocation lives. The kubelet does
// not say when a pod ends; it hands a unit out again only after the pod
// that had it has ended, so a lease is released when a later
// GetPreferredAllocation lists one of its units as available or a later
// Allocate asks for one, or when the PodResources API, having listed the
// container holding its units, lists none for Options.PodGoneAfter. A
// lease mpsd revokes (the pod's CUDA clients died
// with their server; the kubelet restarts the container) ends, and the
// plugin asks for a new one for the same units once the instance is ready.
// A plugin that restarts with mpsd adopts the leases mpsd kept, by their
// job id, and resumes them.
//
// It is a client of mpsd's API over its unix socket (the MPSD interface)
// and, for PreStartContainer and Pods, of the kubelet's PodResources API,
// the API server and the container runtime's CRI:
// it never touches the daemon's state, never runs programs, never kills a
// process (the pods' processes are the kubelet's) and schedules nothing
// across nodes: the kubelet places pods on the node; mpsd decides the
// instance, the limits and what a fault touches.
package deviceplugin
