#!/bin/sh
# mpsd's Slurm epilog: the job leaves nothing behind in mpsd.
#
#   slurm.conf:  Epilog=/etc/slurm/mpsd-epilog.sh
#
# slurmd runs it as root after each job on the node, once the job's
# processes are gone. When Slurm kills a job it kills mps-launch, and mpsd
# then kills the workload (which runs in mpsd's cgroup for its lease, not
# in the job's) before it frees the lease; this waits for that. Slurm
# reads only zero or not: any other status drains the node ("Epilog
# error"; this script's output is in slurmd's log):
#
#   0  mpsd answers and holds no lease tagged with this job (mps-launch
#      tags them with $SLURM_JOB_ID or $SLURM_JOB_ID.<step>), or this node
#      runs no mpsd ($MPSD_CONFIG is absent);
#   1  mpsd does not answer within $MPSD_CHECK_WAIT seconds, or still holds
#      leases of the job after $MPSD_EPILOG_WAIT seconds: their processes
#      would not die, and the GPU capacity they hold is lost until they do;
#   2  the check cannot run: mpsctl or timeout is missing.
#
# Settings, from the environment or $MPSD_SLURM_ENV (sourced if readable):
#   MPSD_CONFIG      mpsd's config; no file, no mpsd here  (/etc/mpsd/mpsd.yaml)
#   MPSD_SOCKET      mpsd's API socket                     (/run/mpsd/mpsd.sock)
#   MPSCTL           the mpsctl program                    (mpsctl, on PATH)
#   MPSD_CHECK_WAIT  seconds to wait for an answer         (10)
#   MPSD_EPILOG_WAIT seconds to wait for the job's leases to end (30)
# Keep PrologEpilogTimeout in slurm.conf above the two waits together.
set -u
# slurmd gives an epilog no PATH.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}
export PATH
MPSD_SLURM_ENV=${MPSD_SLURM_ENV:-/etc/mpsd/slurm.env}
# shellcheck disable=SC1090 # the operator's settings file
[ -r "$MPSD_SLURM_ENV" ] && . "$MPSD_SLURM_ENV"
MPSD_CONFIG=${MPSD_CONFIG:-/etc/mpsd/mpsd.yaml}
MPSD_SOCKET=${MPSD_SOCKET:-/run/mpsd/mpsd.sock}
MPSCTL=${MPSCTL:-mpsctl}
MPSD_CHECK_WAIT=${MPSD_CHECK_WAIT:-10}
MPSD_EPILOG_WAIT=${MPSD_EPILOG_WAIT:-30}
JOB=${SLURM_JOB_ID:-}

say() { echo "mpsd-epilog: job ${JOB:-?}: $*" >&2; }

[ -e "$MPSD_CONFIG" ] || exit 0
for p in "$MPSCTL" timeout; do
	if ! command -v "$p" >/dev/null 2>&1; then
		say "cannot check mpsd: $p not found (PATH=$PATH)"
		exit 2
	fi
done

# status prints mpsctl status --json, or fails after at most 5 s.
status() { timeout 5 "$MPSCTL" --socket "$MPSD_SOCKET" status --json 2>&1; }

# job_leases prints the ids of the leases in status $1 tagged with this job.
job_leases() {
	printf '%s\n' "$1" | awk -v job="$JOB" '
		/"id": "/ { id = $0; sub(/.*"id": "/, "", id); sub(/".*/, "", id) }
		/"job_id": "/ {
			j = $0; sub(/.*"job_id": "/, "", j); sub(/".*/, "", j)
			if (j == job || index(j, job ".") == 1) print id
		}'
}

now() { date +%s; }
# Until mpsd first answers, wait MPSD_CHECK_WAIT; then for the leases, up
# to MPSD_EPILOG_WAIT from the start.
deadline=$(($(now) + MPSD_CHECK_WAIT))
leases_by=$(($(now) + MPSD_EPILOG_WAIT))
while :; do
	out=$(status)
	case $? in
	0)
		[ -n "$JOB" ] || exit 0
		left=$(job_leases "$out" | tr '\n' ' ')
		[ -z "$left" ] && exit 0
		why="mpsd still holds lease(s) ${left}of this job after ${MPSD_EPILOG_WAIT}s (mpsctl status lists their pids)"
		deadline=$leases_by
		;;
	124) why="mpsd at $MPSD_SOCKET gave no status within 5 s" ;;
	*) why="mpsd does not answer at $MPSD_SOCKET: $(printf '%s' "$out" | tail -n 1)" ;;
	esac
	[ "$(now)" -lt "$deadline" ] || break
	sleep 1
done
say "$why"
exit 1
