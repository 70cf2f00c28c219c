// Package systemdtest holds the end-to-end test of examples/systemd: the
// shipped mpsd.socket and mpsd.service, run by a real systemd (Debian's
// systemd 252, the host's own /lib/systemd/systemd) with mpsd --simulate
// on the MPS emulator, and mps-launch, mpsctl and mpsemu-client as the
// clients. It checks socket activation, READY=1 only once every instance
// is up (with STATUS=), the watchdog's kill and restart of a SIGSTOPped
// mpsd, `systemctl restart`, and requests made while mpsd is down, each
// keeping the MPS daemons, the servers and the running clients, and the
// leases' cgroups under the service's delegated cgroup.
//
// # The machine
//
// systemd runs as PID 1 of new pid, mount, UTS, network and cgroup
// namespaces (util-linux's unshare, started in a cgroup2 cgroup of the
// test's that becomes the namespace's cgroup root), booted straight into
// mpsd-test.target. The test's commands enter its namespaces with nsenter;
// systemctl and journalctl reach the manager through its private socket,
// without D-Bus. What keeps it off the host (a systemd as PID 1 would
// otherwise change it):
//
//   - Its unit path is the test's directory alone (SYSTEMD_UNIT_PATH), no
//     generators run: no sysinit.target.wants (systemd-tmpfiles-setup
//     would wipe the host's /tmp), no timers, nothing the host enabled.
//     The targets that default dependencies name are empty units of the
//     test's; journald is Debian's, with Storage=volatile (its journal is
//     in the namespace's /run).
//   - container= is in its environment (a shutdown without it remounts
//     file systems read-only, the host's / among them), and it is never
//     shut down: the test SIGKILLs it by pid, which ends every process of
//     the pid namespace, then removes the cgroups, deepest first.
//   - In its mount namespace / is read-only but for the test's directory
//     (remount,bind: that mount only, never the file system), /run and
//     /dev are private tmpfs, /sys a fresh read-only sysfs, /proc/sys
//     read-only (PID 1 would raise fs.file-max and fs.nr_open and set
//     kernel.core_pattern host-wide), /sys/fs/cgroup a cgroup2 mount made
//     inside the new cgroup namespace.
//   - /etc/machine-id must hold an id (else systemd would run a first
//     boot's presets on /etc); the test refuses to boot otherwise.
//   - The test compares the host's mount table and those sysctls before
//     and after, and fails if they differ.
//   - unshare runs with Pdeathsig and --kill-child: when the test process
//     dies (killed go test), unshare dies, systemd gets SIGKILL and with it
//     the whole namespace; the next run removes the cgroups and the
//     directory a killed run left (their names carry its pid).
//
// # What is changed for the test
//
// Only a drop-in (test.conf): ExecStart= runs the built bin/mpsd with
// --simulate and the test's config (state and logs in the test's
// directory; socket and run_dir the defaults, in the namespace's /run),
// WatchdogSec=6s (pings every 3 s, each after a health check of at most
// 1.5 s: room for a loaded machine) and RestartSec=1s. For the check of
// requests made while mpsd is down a second drop-in adds an
// ExecStartPre= that waits for a gate file. The emulator directory of the config holds a wrapper of the
// emulator's control program that refuses to start a daemon until the
// test opens a gate, so that readiness can be seen to wait for the
// instances.
//
// The test needs root, systemd, util-linux (unshare, nsenter, mount),
// iproute2 (ss) and a cgroup2 hierarchy; without them it skips and says
// why, unless MPSD_REQUIRE_SYSTEMD=1 (CI sets it) makes that a failure.
// The package has no code besides its tests: it runs external programs,
// which only the packages docs/architecture.md#packages names may do outside tests.
package systemdtest
