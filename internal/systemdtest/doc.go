// Package systemdtest holds the end-to-end tests of what the Debian
// package installs (make package-deb, internal/debpkg): the package is
// installed with a real `dpkg -i` inside the test's machine, its
// maintainer scripts talking to the machine's systemd (Debian's systemd
// 252, the host's own /lib/systemd/systemd), and its mpsd.socket and
// mpsd.service run with the package's /usr/bin/mpsd --simulate on the MPS
// emulator, and its mps-launch and mpsctl (with mpsemu-client) as the
// clients.
//
// TestMpsdUnderSystemd checks, file by file, that what dpkg installed is
// the package's (every file of the .deb at its path, the units systemd
// loaded from /lib/systemd/system, dpkg --verify clean, a list of paths
// the package must hold), that the postinst made /var/lib/mpsd (0700) and
// /var/log/mpsd (0755) as mpsd's checks want them and enabled both units
// without starting either, and that the service runs /usr/bin/mpsd; then
// socket activation, READY=1 only once every instance is up (with
// STATUS=), the watchdog's kill and restart of a SIGSTOPped mpsd,
// `systemctl restart`, and requests made while mpsd is down, each keeping
// the MPS daemons, the servers and the running clients, and the leases'
// cgroups under the service's delegated cgroup.
//
// TestDebUpgradeKeepsLeases installs an older build of the package (the
// same programs stamped as an older commit, a lower Debian version), runs
// a lease for each of two users, edits the conffile and installs the new
// package over it: the postinst's restart keeps the leases, their
// processes and MPS servers, mpsctl version names the new mpsd, the
// edit stays. TestDebRemoveKeepsWorkloads: dpkg -r stops nothing, and a
// purge keeps the state while an mpsd serves and removes it once none
// runs and no lease is left.
//
// The package is the one mpsd_*.deb in $MPSD_DIST_DIR (make test and CI
// set it, after make package-deb); without it the tests skip and say why,
// unless MPSD_REQUIRE_SYSTEMD=1.
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
//   - Its unit path is /etc/systemd/system, /run/systemd/system and
//     /lib/systemd/system (SYSTEMD_UNIT_PATH), and in its mount namespace
//     the first and the last are the test's own directories (bind mounts
//     of etc-units and lib-units), so it sees the test's units and the
//     package's, never the host's; no generators run: no
//     sysinit.target.wants (systemd-tmpfiles-setup would wipe the host's
//     /tmp), no timers, nothing the host enabled. The targets that
//     default dependencies name are empty units of the test's; journald's
//     units are copies of Debian's, with Storage=volatile (its journal is
//     in the namespace's /run).
//   - /usr, /etc and /var are overlays whose upper directories are on a
//     tmpfs mounted in the namespace: dpkg installs there, and updates
//     its database there; the host's files and dpkg database are never
//     written, and the tmpfs goes with the namespace. The host's
//     policy-rc.d (a container image's forbids starting services) and
//     man-db's auto-update flag are removed in the overlay only.
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
// The test's config is written over the package's /etc/mpsd/mpsd.yaml
// (an operator's edit of the conffile; state_dir, log_dir, socket and
// run_dir the defaults, the postinst's directories and the namespace's
// /run), and one drop-in (test.conf, in /etc/systemd/system):
// ExecStart= runs the package's /usr/bin/mpsd on that config with
// --simulate, WatchdogSec=6s (pings every 3 s, each after a health check
// of at most 1.5 s: room for a loaded machine) and RestartSec=1s. For the
// check of requests made while mpsd is down a second drop-in adds an
// ExecStartPre= that waits for a gate file. The emulator directory of the
// config holds a wrapper of the emulator's control program that refuses to start a daemon until the
// test opens a gate, so that readiness can be seen to wait for the
// instances.
//
// The test needs root, systemd, util-linux (unshare, nsenter, mount),
// iproute2 (ss), dpkg, init-system-helpers (deb-systemd-helper), an
// overlayfs and a cgroup2 hierarchy; without them it skips and says
// why, unless MPSD_REQUIRE_SYSTEMD=1 (CI sets it) makes that a failure.
// The package has no code besides its tests: it runs external programs,
// which only the packages docs/architecture.md#packages names may do outside tests.
package systemdtest
