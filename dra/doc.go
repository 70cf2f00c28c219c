// Package dra is mpsd's Kubernetes DRA driver (`mpsd --kubelet-dra`), a
// kubelet plugin served through k8s.io/dynamic-resource-allocation's
// kubeletplugin helper (gRPC dra/v1, and v1beta1 for older kubelets).
//
// It owns the node's side of Dynamic Resource Allocation for driver
// mpsd.io:
//
//   - ResourceSlice: one pool named after the node, one device per
//     (GPU, group) instance, "<group>-gpu<index>", whose capacity is the
//     group's SM percent (sm) and memory budget (memory) per GPU. With
//     consumable capacity (Kubernetes 1.36 on) each device allows many
//     allocations, and each capacity has a requestPolicy whose steps are
//     mpsd's admission's: whole SM percents from 1 to the group's max_sm,
//     whole MiB from 1Mi to its max_mem, defaulting to default_sm and
//     default_mem. Without it (Mode Whole) a device is one allocation,
//     whose lease is the group's max_sm and max_mem. Attributes: group,
//     uuid, index, model, driverVersion, mpsVersion (where known),
//     multiuser. An instance that is not ready (starting, recovering,
//     quarantined, draining, drained, retiring) has a NoSchedule taint
//     mpsd.io/unavailable=<state>, lifted when it is ready again. mpsd's
//     status is polled (Options.PollInterval) and the slice published
//     when it changed.
//   - Prepare: each device allocated to a claim becomes a lease on mpsd
//     of the sm and memory the claim consumed, on that instance's GPUs,
//     never queued or requeued, with job id "dra:<claim uid>:<n>"; a
//     lease mpsd refuses fails the claim with mpsd's reason. The claim
//     gets a CDI spec (kind mpsd.io/claim, one file per claim in the CDI
//     directory, written atomically) with what the device plugin gives a
//     container (deviceplugin.ContainerEdits): the lease's environment,
//     the instance's pipe directory read-only with its log FIFO, pid file
//     and lock masked by /dev/null, the instance's private /dev/shm and
//     never the host's; and its status.devices record each lease (id,
//     state, sm, memory). A second prepare of a claim, by this process or
//     by the next one after a restart of mpsd or the kubelet, finds its
//     leases by job id and returns the same CDI devices.
//   - Unprepare releases the claim's leases and removes its CDI spec.
//
// Leases are held as the device plugin holds them: by their open stream
// on mpsd's API; a stream that ends (mpsd restarted) is resumed, a lease
// mpsd ended is asked for anew once its instance is ready, and the CDI
// spec rewritten. A driver that starts adopts the running leases of its
// uid whose job id names a claim.
//
// It is a client of mpsd's API socket (deviceplugin.MPSD), of the API
// server (the helper reads claims and publishes slices; the driver writes
// claim status) and of the CDI directory: it never touches the daemon's
// state, never runs programs, never kills a process, and schedules
// nothing: the scheduler places claims on devices, mpsd admits their
// leases.
package dra
