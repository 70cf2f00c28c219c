#!/bin/sh
# mpsd's Slurm prolog: a job starts on this node only while mpsd serves.
#
#   slurm.conf:  Prolog=/etc/slurm/mpsd-prolog.sh
#
# slurmd runs it as root before each job on the node. Slurm reads only zero
# or not: any other status drains the node ("Prolog error"; this script's
# output is in slurmd's log) and requeues a batch job, held. So it fails
# only when the node really cannot run mpsd's jobs:
#
#   0  mpsd answers and has an instance that takes leases (ready, starting
#      or recovering), or this node runs no mpsd ($MPSD_CONFIG is absent),
#      so one slurm.conf serves nodes with and without mpsd;
#   1  mpsd does not answer within $MPSD_CHECK_WAIT seconds (a restart
#      under systemd takes far less), or every instance is quarantined or
#      draining (mpsctl resume, after the fault is dealt with);
#   2  the check cannot run: mpsctl or timeout is missing.
#
# Settings, from the environment or $MPSD_SLURM_ENV (sourced if readable):
#   MPSD_CONFIG      mpsd's config; no file, no mpsd here  (/etc/mpsd/mpsd.yaml)
#   MPSD_SOCKET      mpsd's API socket                     (/run/mpsd/mpsd.sock)
#   MPSCTL           the mpsctl program                    (mpsctl, on PATH)
#   MPSD_CHECK_WAIT  seconds to wait for an answer         (10)
# Keep PrologEpilogTimeout in slurm.conf above MPSD_CHECK_WAIT.
set -u
# slurmd gives a prolog no PATH.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}
export PATH
MPSD_SLURM_ENV=${MPSD_SLURM_ENV:-/etc/mpsd/slurm.env}
# shellcheck disable=SC1090 # the operator's settings file
[ -r "$MPSD_SLURM_ENV" ] && . "$MPSD_SLURM_ENV"
MPSD_CONFIG=${MPSD_CONFIG:-/etc/mpsd/mpsd.yaml}
MPSD_SOCKET=${MPSD_SOCKET:-/run/mpsd/mpsd.sock}
MPSCTL=${MPSCTL:-mpsctl}
MPSD_CHECK_WAIT=${MPSD_CHECK_WAIT:-10}

say() { echo "mpsd-prolog: job ${SLURM_JOB_ID:-?}: $*" >&2; }

[ -e "$MPSD_CONFIG" ] || exit 0
for p in "$MPSCTL" timeout; do
	if ! command -v "$p" >/dev/null 2>&1; then
		say "cannot check mpsd: $p not found (PATH=$PATH)"
		exit 2
	fi
done

# status prints mpsctl status --json, or fails after at most 5 s.
status() { timeout 5 "$MPSCTL" --socket "$MPSD_SOCKET" status --json 2>&1; }

deadline=$(($(date +%s) + MPSD_CHECK_WAIT))
while :; do
	out=$(status)
	case $? in
	0)
		# Instance states are starting, ready, recovering, quarantined,
		# draining, drained (drained and empty) or retiring; a lease's are
		# queued or running.
		if printf '%s\n' "$out" | grep -Eq '"state": "(ready|starting|recovering)"'; then
			exit 0
		fi
		why="mpsd at $MPSD_SOCKET has no instance that takes leases (all quarantined, draining, drained or retiring; see mpsctl status)"
		;;
	124) why="mpsd at $MPSD_SOCKET gave no status within 5 s" ;;
	*) why="mpsd does not answer at $MPSD_SOCKET: $(printf '%s' "$out" | tail -n 1)" ;;
	esac
	[ "$(date +%s)" -lt "$deadline" ] || break
	sleep 1
done
say "$why; not starting jobs here"
exit 1
