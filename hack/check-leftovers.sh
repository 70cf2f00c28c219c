#!/usr/bin/env bash
# Run after the test suite: fail if tests left MPS (real or emulated) processes,
# mpsd cgroups or default-location MPS files behind. Tests must clean up.
set -u
fail=0
procs=$(pgrep -a -f 'nvidia-cuda-mps-(control|server)|mpsemu-client|bin/mpsd( |$)' | grep -v -e pgrep -e check-leftovers || true)
if [ -n "$procs" ]; then
	echo "check-leftovers: processes left running by the tests:" >&2
	echo "$procs" >&2
	fail=1
fi
# internal/slurmtest runs Slurm and munge from /tmp/mpsd-slurm*, with that
# directory on their command lines.
slurm=$(pgrep -a -f '(munged|slurmctld|slurmd) .*mpsd-slurm' | grep -v -e pgrep -e check-leftovers || true)
if [ -n "$slurm" ]; then
	echo "check-leftovers: Slurm or munge daemons left running by the tests:" >&2
	echo "$slurm" >&2
	fail=1
fi
# internal/systemdtest boots a systemd as PID 1 of private namespaces.
sd=$(pgrep -a -f 'systemd --system --unit=mpsd-test' | grep -v -e pgrep -e check-leftovers || true)
if [ -n "$sd" ]; then
	echo "check-leftovers: namespaced systemd left running by the tests:" >&2
	echo "$sd" >&2
	fail=1
fi
cgs=$(ls -d /sys/fs/cgroup/*/mpsd-test* /sys/fs/cgroup/mpsd-test* /sys/fs/cgroup/unified/mpsd-test* 2>/dev/null || true)
if [ -n "$cgs" ]; then
	echo "check-leftovers: cgroups left by the tests:" >&2
	echo "$cgs" >&2
	fail=1
fi
# mps/ tests keep pipe dirs short (unix socket paths are limited) in /tmp/mpst*,
# internal/slurmtest in /tmp/mpsd-slurm*, internal/systemdtest in /tmp/mpsd-systemd*.
tmps=$(ls -d "${TMPDIR:-/tmp}"/mpst* "${TMPDIR:-/tmp}"/mpsd-slurm* "${TMPDIR:-/tmp}"/mpsd-systemd* 2>/dev/null || true)
if [ -n "$tmps" ]; then
	echo "check-leftovers: temporary directories left by the tests:" >&2
	echo "$tmps" >&2
	fail=1
fi
# Test users (emutest.User) are named mpsdt<uid> and removed by their test.
users=$(getent passwd | cut -d: -f1 | grep '^mpsdt[0-9]' || true)
if [ -n "$users" ]; then
	echo "check-leftovers: test users left behind:" >&2
	echo "$users" >&2
	fail=1
fi
# Tests always pass their own pipe and log directories; MPS's defaults must stay untouched.
for d in /tmp/nvidia-mps /var/log/nvidia-mps; do
	if [ -e "$d" ]; then
		echo "check-leftovers: $d exists: a test used MPS's default directory" >&2
		fail=1
	fi
done
[ "$fail" = 0 ] && echo "check-leftovers: no processes, cgroups, temporary or default MPS directories, or test users left behind"
exit "$fail"
