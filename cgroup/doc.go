// Package cgroup gives every lease its own cgroup (mpsd/<group>/<lease>) on
// cgroup v2, hybrid and v1 hosts, over github.com/containerd/cgroups/v3:
// create with limits, attach, list, kill until empty, delete, stats and
// re-listing for adoption after an mpsd restart.
package cgroup
