// Package cgroup gives every lease its own cgroup (mpsd/<owner>/<group>/<lease>) on
// cgroup v2, hybrid and v1 hosts, over github.com/containerd/cgroups/v3:
// create with limits, attach, list, kill until empty, delete, stats and
// re-listing for adoption after an mpsd restart.
//
// # What it owns
//
// The lease cgroups in its owner's directory under one configured parent
// (Config.Parent, "mpsd" by default or a delegated systemd subtree;
// Config.Owner, mpsd's instance id) and the group directories between
// them, in every hierarchy the backend uses. List, Open, Kill and Delete
// reach nothing else: another owner's directory under the same parent is
// only named by Unowned, never listed, opened or signalled, so two mpsds
// with their own state directories can share a parent. The one exception
// is Open of a lease made before owners existed (straight under the
// parent), which the caller asks for by name because its own records say
// it is its lease. The backends:
//
//   - ModeV2: the unified tree does limits (cpu.weight, cpu.max, memory.max
//     with memory.oom.group, pids.max), membership, cgroup.kill and
//     CLONE_INTO_CGROUP.
//   - ModeHybrid: v1 cpu, cpuacct, memory and pids do limits and stats; the
//     unified tree does membership, cgroup.kill and CLONE_INTO_CGROUP.
//   - ModeV1: v1 controllers do everything; the freezer tree is the
//     membership authority and Kill freezes, SIGKILLs and thaws in rounds.
//
// ModeAuto picks one from cgroups.Mode(). Mount roots are configurable so a
// test or a host with unusual mounts can point elsewhere.
//
// Kill returns only when the lease is empty, forks during the kill
// included (see kill.go), or when its context ends. Start places a command
// the caller built inside the lease before the program's first instruction
// (see start.go for the clone3 and ptrace mechanisms and their limits).
//
// Disabled is the same Manager without cgroups, for non-root simulation: it
// tracks the processes it is given through pidfds and logs once that
// isolation is off.
//
// # What it never does
//
// It never touches cgroups outside its owner's directory (but for the
// Open by name above), never removes the parent
// itself (it may be a delegated subtree), never moves mpsd itself into a
// lease, never attaches or signals its own pid, and never decides anything:
// which limits a lease gets and when to kill it is mpsd's business. It
// starts only commands its caller built (os/exec for a given *exec.Cmd);
// it runs no program of its own. It does not log except for Disabled's one
// warning and debug lines of the real manager through the injected
// *slog.Logger.
package cgroup
