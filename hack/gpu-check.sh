#!/usr/bin/env bash
# hack/gpu-check.sh: check mpsd on a real GPU host, in one prepared run of
# about a minute (at most 5).
#
# mpsd runs with real NVML and NVIDIA's real MPS: tenant groups alpha, beta
# and delta (gamma too as root, step 6), each with its own MPS control
# daemon on GPU 0. The script
#   1. compiles two tiny CUDA programs with nvcc (hack/cuda/gpu_check_client.cu,
#      which reads its SM count and memory, allocates and spins, and
#      hack/cuda/gpu_check_fault.cu, which triggers an illegal-address fault);
#   2. checks that a client launched with `mps-launch --sm 25 --mem 2G` sees
#      about 25% of the SMs and cannot allocate past about 2 GiB;
#   3. runs two long clients in each group, then faults one of alpha's: beta's
#      clients must run on with the same pids and finish, alpha's must be
#      requeued ("requeued, attempt 2") and finish;
#   4. prints the metrics, mpsd's account of the fault, and a summary with
#      PASS/FAIL lines and timings;
#   5. as root, the Kubernetes mode's private /dev/shm (step 6 in the
#      output): a third group, gamma, is served by mpsd's kubelet device
#      plugin (--kubelet-device-plugin --kubelet-groups gamma, no kubelet on
#      the host), so mpsd runs gamma's MPS daemon in a mount namespace whose
#      /dev/shm is the instance's <run_dir>/gamma/<uuid>/shm. It checks that
#      the daemon's and the server's /dev/shm is that directory, that a
#      client given exactly a pod's mounts (built with unshare: the pipe
#      directory read-only, /dev/null read-only over its log FIFO, pid file and control_lock, the
#      instance's shm directory at /dev/shm) reaches the server and runs
#      within its limits, and records what a client on the host, with the
#      host's /dev/shm, gets from the same server (expected: it cannot share
#      memory with it and fails or hangs; whichever happens is recorded as
#      RECORD, not judged);
#   6. step 7 (hack/gpu-check-mps.sh): the versions mpsd reports, the client
#      priority a lease gets and clients with either priority, and, as
#      root, the per-server caps of an ACTIVE server of a non-root owner
#      (a stranger's and the owner's attempts to lift them);
#   7. step 8 (hack/gpu-check-limits.sh), in a group of its own, delta
#      (memory_grace 2s, reconcile: terminate), whose clients run as a
#      non-root uid: the memory mpsd reads through NVML for a lease whose
#      client holds 1 GiB, and whether NVML lists MPS clients' pids or only
#      the server's (RECORD); a command under `mps-launch --mem 2G` that
#      sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT itself with an entry for a
#      device it cannot see (MPS then drops every pinned limit) and holds
#      3 GiB: MPS refuses it or mpsd revokes the lease ("memory limit
#      exceeded", exit 125), and what a raw client with that entry gets
#      (RECORD); a client started on delta's pipe directory without
#      mps-launch is reported and ended while a leased bystander of the
#      same server runs on.
#
# Usage, on the GPU host, from a checkout where `make build` has made bin/
# (the host needs no Go):
#   hack/gpu-check.sh [OUTDIR]
# OUTDIR (or $OUT): where to keep gpu-check.txt (this output), mpsd.log, the
# MPS logs and the clients' logs. Needs nvcc (PATH, $NVCC or
# $CUDA_HOME/bin), nvidia-smi, nvidia-cuda-mps-control and -server
# ($MPS_CONTROL, PATH, /usr/bin, /usr/local/nvidia/bin); root for per-lease
# cgroups (without root cgroups are off, and it says so). Reads
# `mpsctl status --json` with python3 or jq, else the plain table.
#
# It uses GPU 0 only, in its own directories under /tmp (MPS socket paths
# are limited to 107 bytes), never touches MPS's default directories, and
# never changes the GPU's compute mode or resets it. However it ends it stops
# mpsd, the launchers and clients, quits every group's MPS control daemon,
# removes its cgroups and its temporary directories. One thing it may change
# on the host, and undoes on exit: mpsd passes only PATH, HOME, LANG, TZ and
# LC_* to the MPS daemons, so when libcuda.so.1 is found only through
# LD_LIBRARY_PATH (some containers), it adds that directory to the dynamic
# linker's cache for the run (GPU_CHECK_NO_LDCONFIG=1: don't; the MPS server
# will then likely fail to start).
#
# GPU_CHECK_DRY_RUN=1 runs the same flow on a machine without a GPU: mpsd
# --simulate (a mock H200 and the MPS emulator) and stand-ins for the CUDA
# programs built on bin/emu/mpsemu-client. Its SM counts and allocation
# figures are made up by the stand-ins from the MPS environment they get;
# the mpsd plumbing (launches, fault, revoke, requeue, metrics, cleanup) is
# real. GPU_CHECK_PARSER=python3|jq|table forces how status is read.
#
# Exit status: 0 every check passed, 1 a check failed or a step could not
# run, 143/130 stopped (GPU_CHECK_TIMEOUT, default 280 s, or a signal).
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$REPO/bin
EMU=$BIN/emu
DRY=${GPU_CHECK_DRY_RUN:-0}
[[ $DRY == 1 ]] || DRY=0
OUTDIR=${1:-${OUT:-}}
UID_NOW=$(id -u)
GIT_REV=$(git -C "$REPO" describe --always --dirty 2>/dev/null)

now() { date +%s.%N; }
T0=$(now)
# dt FROM [TO]: seconds between two timestamps, two decimals.
dt() { awk -v a="$1" -v b="${2:-$(now)}" 'BEGIN { printf "%.2f", b - a }'; }

if [[ -n $OUTDIR ]]; then
	mkdir -p "$OUTDIR" || exit 1
	OUTDIR=$(cd "$OUTDIR" && pwd)
	exec > >(tee "$OUTDIR/gpu-check.txt") 2>&1
fi

# ---------------------------------------------------------------- output --
heading() { printf '\n== %s ==\n' "$*"; }
say() { printf '%s\n' "$*"; }
show() { printf '$ %s\n' "$*"; }
RESULTS=()
TIMINGS=()
NFAIL=0
SUMMARY_DONE=0
pass() {
	say "PASS  $*"
	RESULTS+=("PASS  $*")
}
fail() {
	say "FAIL  $*"
	RESULTS+=("FAIL  $*")
	NFAIL=$((NFAIL + 1))
}
note() { say "NOTE  $*"; }
timing() {
	say "TIME  $1: $2 s"
	TIMINGS+=("$(printf '%-52s %7s s' "$1" "$2")")
}
# die: a step that the rest depends on failed; cleanup runs on exit.
die() {
	fail "$*"
	if [[ -n ${D:-} && -f $D/mpsd.log ]]; then
		say "--- last lines of mpsd's log ---"
		tail -n 25 "$D/mpsd.log"
	fi
	exit 1
}

# ------------------------------------------------------------- the place --
# Short paths: <run_dir>/<group>/GPU-<uuid>/pipe/control_privileged must fit
# in 107 bytes.
D=$(mktemp -d "${GPU_CHECK_TMP:-/tmp}/gck.XXXXXX") || exit 1
chmod 755 "$D" # the MPS daemons and servers run as the clients' uid
mkdir -p "$D/clients" "$D/bin"
BASE=$D # run_dir and log_dir live here; they need POSIX ACLs
ALT_BASE=''
CGROUP_PARENT=gpu-check-$$
MPSD_PID=''
WATCHDOG_PID=''
LDCONF=''
CTL=''
LAUNCHERS=()
export MPSD_SOCKET=$D/mpsd.sock

# ---------------------------------------------------------------- cleanup --
# stop_pid PID EXE_PREFIX: TERM the process if its executable is still under
# EXE_PREFIX, wait up to 5 s, then KILL.
stop_pid() {
	local pid=$1 prefix=$2 exe
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 0
	[[ $exe == "$prefix"* ]] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
}

cleanup() {
	local rc=$? p pipe pids dir ctl alive
	trap - EXIT INT TERM HUP
	set +u
	if [[ -n $WATCHDOG_PID ]]; then
		# The watchdog first (else it would signal us once its sleep ends),
		# then its sleep.
		p=$(pgrep -P "$WATCHDOG_PID" sleep 2>/dev/null)
		kill "$WATCHDOG_PID" 2>/dev/null
		[[ -n $p ]] && kill "$p" 2>/dev/null
	fi
	say
	say "-- cleanup --"
	if ((SUMMARY_DONE == 0 && ${#RESULTS[@]} > 0)); then
		say "Results so far (the run did not finish):"
		for p in "${RESULTS[@]}"; do say "  $p"; done
		say
	fi
	# Launchers forward TERM to their clients: all at once, then up to 5 s.
	local termed=()
	for p in "${LAUNCHERS[@]}"; do
		[[ $(readlink "/proc/$p/exe" 2>/dev/null) == "$BIN/mps-launch" ]] && kill -TERM "$p" 2>/dev/null && termed+=("$p")
	done
	for p in "${termed[@]}"; do
		stop_pid "$p" "$BIN/mps-launch"
	done
	declare -F limits_cleanup >/dev/null && limits_cleanup # step 8's client without a launcher
	# SIGTERM stops mpsd only; its MPS daemons run on by design.
	if [[ -n $MPSD_PID ]] && kill -0 "$MPSD_PID" 2>/dev/null; then
		kill -TERM "$MPSD_PID" 2>/dev/null
		for _ in $(seq 100); do
			kill -0 "$MPSD_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$MPSD_PID" 2>/dev/null && say "mpsd did not stop on SIGTERM within 10 s; killed"
		wait "$MPSD_PID" 2>/dev/null
		say "mpsd stopped"
	fi
	# Quit every instance's MPS control daemon, then stop what did not go
	# with it within 10 s (a hung daemon or server).
	ctl=$CTL
	[[ $DRY == 1 ]] && ctl=$EMU/nvidia-cuda-mps-control
	local mps_pids=()
	for dir in "$BASE" "$ALT_BASE"; do
		[[ -n $dir && -d $dir/run && -n $ctl ]] || continue
		while IFS= read -r pipe; do
			pids=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 5 "$ctl" 2>/dev/null)
			[[ -f $pipe/nvidia-cuda-mps-control.pid ]] && pids+=" $(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)"
			for p in $pids; do
				[[ $p =~ ^[0-9]+$ ]] && mps_pids+=("$p")
			done
			echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 15 "$ctl" >/dev/null 2>&1
			say "quit the MPS control daemon of ${pipe#"$dir"/run/} (daemon and servers: ${pids//$'\n'/ })"
		done < <(find "$dir/run" -type d -name pipe 2>/dev/null)
	done
	for _ in $(seq 100); do
		alive=0
		for p in "${mps_pids[@]}"; do
			kill -0 "$p" 2>/dev/null && alive=1
		done
		((alive)) || break
		sleep 0.1
	done
	for p in "${mps_pids[@]}"; do
		if kill -0 "$p" 2>/dev/null && [[ $(cat "/proc/$p/comm" 2>/dev/null) == nvidia-cuda-mps* ]]; then
			kill -KILL "$p" 2>/dev/null && say "killed MPS process $p, which outlived quit by 10 s"
		fi
	done
	# Per-lease cgroups: anything left in them is ours.
	if ((UID_NOW == 0)); then
		for dir in /sys/fs/cgroup/"$CGROUP_PARENT" /sys/fs/cgroup/*/"$CGROUP_PARENT"; do
			[[ -d $dir ]] || continue
			while IFS= read -r p; do
				kill -KILL "$p" 2>/dev/null
			done < <(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null)
			sleep 0.2
			find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null
			if [[ -d $dir ]]; then say "could not remove cgroup $dir"; else say "removed cgroup $dir"; fi
		done
	fi
	declare -F caps_cleanup >/dev/null && caps_cleanup # step 7's own daemon
	# mpsd mounts each served instance's private /dev/shm (a tmpfs,
	# source mpsd-shm) and keeps it when SIGTERM stops mpsd alone: those
	# under this run's directories are ours to unmount, now that their
	# daemons are gone.
	if ((UID_NOW == 0)); then
		for dir in "$D" "$ALT_BASE"; do
			[[ -n $dir ]] || continue
			while IFS= read -r p; do
				umount "$p" 2>/dev/null && say "unmounted $p"
			done < <(awk -v d="$dir/" 'index($5, d) == 1 && / - tmpfs mpsd-shm / {print $5}' /proc/self/mountinfo | sort -r)
		done
	fi
	if [[ -n $LDCONF ]]; then
		rm -f "$LDCONF" && ldconfig && say "removed $LDCONF and rebuilt the linker cache"
	fi
	if [[ -n $OUTDIR ]]; then
		[[ -f $D/mpsd.log ]] && cp "$D/mpsd.log" "$OUTDIR/"
		[[ -f $D/mpsd.yaml ]] && cp "$D/mpsd.yaml" "$OUTDIR/"
		[[ -d $D/clients ]] && cp -r "$D/clients" "$OUTDIR/"
		[[ -d $BASE/log ]] && cp -r "$BASE/log" "$OUTDIR/mps-log"
		say "logs kept in $OUTDIR"
	fi
	rm -rf "$D"
	[[ -n $ALT_BASE ]] && rm -rf "$ALT_BASE"
	say "removed $D${ALT_BASE:+ and $ALT_BASE}"
	if ((NFAIL > 0 && rc == 0)); then
		rc=1
	fi
	say "gpu-check: exit status $rc after $(dt "$T0") s"
	exit "$rc"
}
trap cleanup EXIT
trap 'say "gpu-check: interrupted"; exit 130' INT
trap 'say "gpu-check: stopped by SIGTERM or SIGHUP (the ${GPU_CHECK_TIMEOUT:-280} s time limit sends SIGTERM)"; exit 143' TERM HUP

# A time limit for the whole run, cleanup excepted.
LIMIT=${GPU_CHECK_TIMEOUT:-280}
# Its output goes nowhere: a sleep holding this script's stdout open would
# keep whoever reads it waiting; cleanup ends the sleep too.
(
	sleep "$LIMIT"
	kill -TERM $$
) >/dev/null 2>&1 </dev/null &
WATCHDOG_PID=$!

# ----------------------------------------------------------------- tools --
for b in "$BIN/mpsd" "$BIN/mpsctl" "$BIN/mps-launch"; do
	[[ -x $b ]] || die "$b is missing: run 'make build' on a machine with Go and carry bin/"
	# Built elsewhere with cgo: it needs this host's glibc to be as new (2.34).
	"$b" --help >/dev/null 2>"$D/err" || die "$b does not run here: $(head -c 400 "$D/err") ($(ldd --version 2>/dev/null | head -n 1))"
done
if [[ $DRY == 1 ]]; then
	for b in "$EMU/mpsemu-client" "$EMU/nvidia-cuda-mps-control" "$EMU/nvidia-cuda-mps-server"; do
		[[ -x $b ]] || die "$b is missing: run 'make build'"
	done
fi

PARSER=${GPU_CHECK_PARSER:-}
if [[ -z $PARSER ]]; then
	if command -v python3 >/dev/null 2>&1; then
		PARSER=python3
	elif command -v jq >/dev/null 2>&1; then
		PARSER=jq
	else
		PARSER=table
	fi
fi

# find_mps: NVIDIA's control daemon: $MPS_CONTROL, PATH, then the usual places.
find_mps() {
	local c
	for c in "${MPS_CONTROL:-}" "$(command -v nvidia-cuda-mps-control 2>/dev/null)" /usr/bin/nvidia-cuda-mps-control \
		/usr/local/nvidia/bin/nvidia-cuda-mps-control /usr/local/bin/nvidia-cuda-mps-control /usr/sbin/nvidia-cuda-mps-control; do
		if [[ -n $c && -x $c ]]; then
			echo "$c"
			return 0
		fi
	done
	return 1
}

# ------------------------------------------------------------ status --
# st_inst GROUP FIELD: a field of GROUP's instance on GPU 0 (state,
# daemon_pid, server_pids, clients, restarts); lists space-separated.
st_inst() {
	case $PARSER in
	python3)
		"$BIN/mpsctl" status --json 2>/dev/null | python3 -c '
import json, sys
g, f = sys.argv[1], sys.argv[2]
for i in json.load(sys.stdin)["instances"]:
    if i["group"] == g and i["gpu_index"] == 0:
        v = i.get(f)
        print(" ".join(map(str, v)) if isinstance(v, list) else v)
' "$1" "$2"
		;;
	jq)
		"$BIN/mpsctl" status --json 2>/dev/null | jq -r --arg g "$1" --arg f "$2" \
			'.instances[] | select(.group == $g and .gpu_index == 0) | .[$f] | if type == "array" then map(tostring) | join(" ") else tostring end'
		;;
	*)
		"$BIN/mpsctl" status 2>/dev/null | awk -v g="$1" -v f="$2" '
/^INSTANCES/ { s = "i"; next }
/^RUNNING/ { s = "l"; next }
/^QUEUE/ { s = "q"; next }
s == "i" && $1 == "0" && $3 == g {
	m["state"] = $4; m["daemon_pid"] = $5; m["server_pids"] = $6; m["clients"] = $7; m["restarts"] = $11
	v = m[f]; sub("/.*", "", v); if (v == "-") v = ""; gsub(",", " ", v); print v; exit
}'
		;;
	esac
}

# st_pids GROUP: the pids of GROUP's running leases, sorted, space-separated.
st_pids() {
	case $PARSER in
	python3)
		"$BIN/mpsctl" status --json 2>/dev/null | python3 -c '
import json, sys
print(" ".join(str(p) for p in sorted(p for l in json.load(sys.stdin)["leases"] if l["group"] == sys.argv[1] and l["state"] == "running" for p in l.get("pids") or [])))
' "$1"
		;;
	jq)
		"$BIN/mpsctl" status --json 2>/dev/null | jq -r --arg g "$1" \
			'[.leases[] | select(.group == $g and .state == "running") | .pids // [] | .[]] | sort | map(tostring) | join(" ")'
		;;
	*)
		"$BIN/mpsctl" status 2>/dev/null | awk -v g="$1" '
/^INSTANCES/ { s = "i"; next }
/^RUNNING/ { s = "l"; next }
/^QUEUE/ { s = "q"; next }
s == "l" && $1 == "ID" { for (i = 1; i <= NF; i++) if ($i == "PIDS") c = i; next }
s == "l" && c && $2 == g && $c ~ /^[0-9][0-9,]*$/ { n = split($c, a, ","); for (i = 1; i <= n; i++) print a[i] }' | sort -n | paste -sd' ' -
		;;
	esac
}

# st_ready: mpsd answers and both instances (gamma's too, with K8S) are
# ready.
st_ready() {
	[[ $(st_inst alpha state 2>/dev/null) == ready && $(st_inst beta state 2>/dev/null) == ready ]] &&
		{ ((K8S == 0)) || [[ $(st_inst gamma state 2>/dev/null) == ready ]]; }
}

# http_get URL-PATH: GET from mpsd's metrics listener.
http_get() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsS --max-time 5 "http://$METRICS$1"
	elif command -v python3 >/dev/null 2>&1; then
		python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1], timeout=5).read().decode())' "$METRICS$1"
	else
		local host=${METRICS%:*} port=${METRICS##*:}
		(
			exec 3<>"/dev/tcp/$host/$port" || exit 1
			printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" "$METRICS" >&3
			timeout 5 cat <&3 | sed '1,/^\r*$/d'
		)
	fi
}

# ------------------------------------------------------------ launches --
declare -A LPID RC
# launch NAME GROUP SM MEM PROGRAM ARGS...: mps-launch in the background; its
# output and the client's in clients/NAME.log.
launch() {
	local name=$1 group=$2 sm=$3 mem=$4
	shift 4
	show "mps-launch --group $group --sm $sm --mem $mem --wait 60s -- $(basename "$1") ${*:2} &   # $name"
	"$BIN/mps-launch" --group "$group" --sm "$sm" --mem "$mem" --wait 60s -- "$@" \
		</dev/null >"$D/clients/$name.log" 2>&1 &
	LPID[$name]=$!
	LAUNCHERS+=($!)
}
# finish NAME SECONDS: wait for the launcher (TERM it after SECONDS); its
# exit status in RC[NAME].
finish() {
	local name=$1 until=$((SECONDS + $2)) rc=0
	while kill -0 "${LPID[$name]}" 2>/dev/null && ((SECONDS < until)); do
		sleep 0.1
	done
	if kill -0 "${LPID[$name]}" 2>/dev/null; then
		say "$name: still running after $2 s; stopping it"
		stop_pid "${LPID[$name]}" "$BIN/mps-launch"
	fi
	wait "${LPID[$name]}" || rc=$?
	RC[$name]=$rc
}
# print_log NAME: the client's and launcher's lines, indented.
print_log() { sed "s/^/  [$1] /" "$D/clients/$1.log" 2>/dev/null; }
# field NAME KEY [LINE-PATTERN]: the value of KEY= on the first line of
# NAME's log that matches LINE-PATTERN.
field() { grep -E "${3:-.}" "$D/clients/$1.log" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2-; }
ready_count() { grep -c ' ready t=' "$D/clients/$1.log" 2>/dev/null; }
has() { grep -q -- "$2" "$D/clients/$1.log" 2>/dev/null; }
need_mpsd() { kill -0 "$MPSD_PID" 2>/dev/null || die "mpsd exited unexpectedly"; }
# mpsd_log_time PATTERN: the time of the first line of mpsd.log that matches
# PATTERN, in seconds since the epoch.
mpsd_log_time() {
	local ts
	ts=$(grep -m1 -- "$1" "$D/mpsd.log" 2>/dev/null | sed -n 's/^time=\([^ ]*\) .*/\1/p')
	[[ -n $ts ]] && date -d "$ts" +%s.%N 2>/dev/null
}

# wait_until SECONDS WHAT COMMAND...: poll COMMAND every 0.1 s.
wait_until() {
	local limit=$1 what=$2
	shift 2
	local until=$((SECONDS + limit))
	until "$@"; do
		((SECONDS < until)) || return 1
		if [[ -n $MPSD_PID ]] && ! kill -0 "$MPSD_PID" 2>/dev/null; then
			die "mpsd exited while waiting for $what"
		fi
		sleep 0.1
	done
}

# ================================================================ host ==
heading "mpsd GPU check$([[ $DRY == 1 ]] && echo ' (DRY RUN: mpsd --simulate and the MPS emulator; no GPU)')"
say "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host: $(uname -n), kernel $(uname -r); uid $UID_NOW"
say "repository: $REPO${GIT_REV:+ at $GIT_REV}; mpsd binary built $(date -u -r "$BIN/mpsd" '+%Y-%m-%d %H:%M UTC' 2>/dev/null)"
say "working directory: $D"
say "status parser: $PARSER"

if [[ $DRY == 1 ]]; then
	CTL=$EMU/nvidia-cuda-mps-control
	say "MPS: the emulator in $EMU"
	CMODE_BEFORE=n/a
else
	CTL=$(find_mps) || die "nvidia-cuda-mps-control not found (PATH, /usr/bin, /usr/local/nvidia/bin); set MPS_CONTROL"
	CTL_DIR=$(dirname "$CTL")
	[[ -x $CTL_DIR/nvidia-cuda-mps-server ]] || command -v nvidia-cuda-mps-server >/dev/null 2>&1 ||
		die "nvidia-cuda-mps-server not found next to $CTL or on PATH"
	command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found"
	NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
	[[ -x $NVCC ]] || die "nvcc not found (PATH, \$NVCC, \$CUDA_HOME/bin)"
	show "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode,mig.mode.current --format=csv"
	nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode,mig.mode.current --format=csv
	CMODE_BEFORE=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader 2>/dev/null)
	say "MPS control: $CTL ($(readlink -f "$CTL"))"
	say "MPS server:  $(if [[ -x $CTL_DIR/nvidia-cuda-mps-server ]]; then echo "$CTL_DIR/nvidia-cuda-mps-server"; else command -v nvidia-cuda-mps-server; fi)"
	say "nvcc: $NVCC ($("$NVCC" --version | grep -o 'release [^,]*' | head -n 1))"
	if [[ $CMODE_BEFORE != Default ]]; then
		note "GPU 0's compute mode is $CMODE_BEFORE: two groups' MPS servers may exclude each other (left as it is)"
	fi
	others=$(pgrep -a -f 'nvidia-cuda-mps-(control|server)' 2>/dev/null)
	[[ -n $others ]] && note "MPS processes already running on this host (left alone): $others"
	# The MPS server needs libcuda.so.1, but mpsd gives its daemons only PATH,
	# HOME, LANG, TZ and LC_*: a library found only through LD_LIBRARY_PATH is
	# not found by the server.
	if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
		libdir=''
		IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
		for dir in "${dirs[@]}" /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64 /usr/lib/x86_64-linux-gnu; do
			if [[ -n $dir && -e $dir/libcuda.so.1 ]]; then
				libdir=$dir
				break
			fi
		done
		if [[ -z $libdir ]]; then
			note "libcuda.so.1 is neither in the linker cache nor in LD_LIBRARY_PATH; the MPS server may not start"
		elif [[ ${GPU_CHECK_NO_LDCONFIG:-0} == 1 || $UID_NOW != 0 ]]; then
			note "libcuda.so.1 is only in $libdir (LD_LIBRARY_PATH), which mpsd does not pass to the MPS daemons; the server will likely fail to start"
		else
			LDCONF=/etc/ld.so.conf.d/000-mpsd-gpu-check.conf
			echo "$libdir" >"$LDCONF" && ldconfig
			note "libcuda.so.1 is only in $libdir (LD_LIBRARY_PATH), which mpsd does not pass to the MPS daemons:"
			note "added $libdir to the linker cache for this run ($LDCONF, removed on exit)"
		fi
	fi
fi
if ((UID_NOW == 0)); then
	CGROUP_YAML="  enabled: true
  parent: $CGROUP_PARENT"
	say "cgroups: on, one per lease under $CGROUP_PARENT ($(stat -fc %T /sys/fs/cgroup 2>/dev/null))"
else
	CGROUP_YAML="  enabled: false"
	note "not root: cgroups are off (leases are not confined to cgroups)"
fi

# ============================================================= programs ==
heading "1. The CUDA programs"
CLIENT=$D/bin/gpu_check_client
FAULT=$D/bin/gpu_check_fault
if [[ $DRY == 1 ]]; then
	say "DRY RUN: stand-ins on $EMU/mpsemu-client instead of nvcc builds; their"
	say "SM counts and allocation figures are computed from the MPS environment"
	say "mps-launch gives them (132 SMs, TPCs of 2, 271 MiB of context), not measured."
	cat >"$CLIENT" <<EOF
#!/usr/bin/env bash
# Dry-run stand-in for gpu_check_client: same output lines, figures made up
# from the MPS environment; the MPS connection is the emulator's client,
# which holds what --alloc got with --hold (so the simulated NVML reports it).
info=0 alloc=0 dur=0 hold=0 got=0
while (( \$# )); do
	case \$1 in
	--info) info=1 ;;
	--alloc) alloc=\$2; shift ;;
	--hold) hold=1 ;;
	--duration) dur=\$2; shift ;;
	esac
	shift
done
pct=\${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-100}
# mib VALUE: a pinned limit in MiB, read as MPS reads it (G is GiB, any
# other suffix MiB).
mib() { [[ \$1 =~ ^([0-9]+)(.*)\$ ]] || return 1; if [[ \${BASH_REMATCH[2]} == G ]]; then echo \$(( BASH_REMATCH[1] * 1024 )); else echo "\${BASH_REMATCH[1]}"; fi; }
# The client's pinned limit: its own entries, as the emulator reads them
# (one naming a device it does not see, here anything but 0 or its UUID,
# drops them all), under its server's (the daemon's default: the group's
# max_mem).
lim=143155 own=''
IFS=, read -r -a ents <<<"\${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-}"
for e in "\${ents[@]}"; do
	[[ \$e == *=* ]] || continue
	k=\${e%%=*}
	if [[ \$k != 0 && \$k != "\${CUDA_VISIBLE_DEVICES:-}" ]]; then own=''; break; fi
	own=\$(mib "\${e#*=}")
done
if (( ! info )); then
	srv=\$(echo get_default_device_pinned_mem_limit 0 | CUDA_MPS_PIPE_DIRECTORY=\${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps} timeout 5 "$EMU/nvidia-cuda-mps-control" 2>/dev/null)
	srv=\$(mib "\$srv") && (( srv < lim )) && lim=\$srv
fi
[[ -n \$own ]] && (( own < lim )) && lim=\$own
t() { date +%s.%3N; }
echo "client[\$\$] start t=\$(t) attempt=\${MPSD_ATTEMPT:--} env_sm=\${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:--} env_mem=\${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:--} pipe=\${CUDA_MPS_PIPE_DIRECTORY:--}"
sms=\$(( 132 * \${pct%.*} / 100 / 2 * 2 ))
free=\$(( lim - 271 ))
echo "client[\$\$] ready t=\$(t) attempt=\${MPSD_ATTEMPT:--} sm_count=\$sms mem_total_mib=143155 mem_free_mib=\$free devices=1 name=stand-in"
(( info )) && exit 0
if [[ \$alloc != 0 ]]; then
	want=\$(awk -v g="\$alloc" 'BEGIN { printf "%d", g * 1024 }')
	got=\$(( free / 256 * 256 )); stopped=yes err="2 cudaErrorMemoryAllocation"
	(( got >= want )) && { got=\$want; stopped=no; err="0 -"; }
	echo "client[\$\$] alloc t=\$(t) requested_mib=\$want got_mib=\$got stopped=\$stopped error=\$err"
fi
if [[ \$dur != 0 ]]; then
	echo "client[\$\$] spinning t=\$(t) for \$dur s"
	(( hold && got > 0 )) && exec "$EMU/mpsemu-client" --alloc "\${got}M" --duration "\${dur}s"
	exec "$EMU/mpsemu-client" --duration "\${dur}s"
fi
EOF
	cat >"$FAULT" <<EOF
#!/usr/bin/env bash
# Dry-run stand-in for gpu_check_fault: the emulator's client raises the
# fault (the emulated server then fails every client of its server).
after=5 dur=5
while (( \$# )); do
	case \$1 in
	--after) after=\$2; shift ;;
	--duration) dur=\$2; shift ;;
	esac
	shift
done
t() { date +%s.%3N; }
a=\${MPSD_ATTEMPT:--}
echo "fault[\$\$] start t=\$(t) attempt=\$a env_sm=\${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:--} env_mem=\${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:--}"
echo "fault[\$\$] ready t=\$(t) attempt=\$a sm_count=0"
if [[ \$a != - && \$a != 1 ]]; then
	echo "fault[\$\$] attempt \$a: not faulting again; spinning \$dur s"
	exec "$EMU/mpsemu-client" --duration "\${dur}s"
fi
"$EMU/mpsemu-client" --fault-after "\${after}s" --duration 120s &
c=\$!
sleep "\$after"
echo "fault[\$\$] faulting now t=\$(t) (the emulator's client raises the fault)"
wait \$c
rc=\$?
echo "fault[\$\$] faulted t=\$(t): the emulator's client exited \$rc (as intended)"
exit 1
EOF
	chmod +x "$CLIENT" "$FAULT"
	timing "compile (stand-ins)" 0.00
else
	for prog in gpu_check_client gpu_check_fault; do
		t=$(now)
		show "nvcc -O2 -o $prog hack/cuda/$prog.cu"
		timeout 180 "$NVCC" -O2 -o "$D/bin/$prog" "$REPO/hack/cuda/$prog.cu" || die "nvcc could not build $prog"
		timing "compile $prog" "$(dt "$t")"
	done
fi

# The full SM count: a client without MPS, before any daemon of ours runs
# (a pipe directory with no daemon: it cannot join another MPS).
show "CUDA_VISIBLE_DEVICES=0 gpu_check_client --info   # without MPS"
CUDA_MPS_PIPE_DIRECTORY=$D/no-mps CUDA_VISIBLE_DEVICES=0 timeout 60 "$CLIENT" --info >"$D/clients/baseline.log" 2>&1
print_log baseline
FULL_SM=$(field baseline sm_count ' ready ')
[[ $FULL_SM =~ ^[0-9]+$ && $FULL_SM -gt 0 ]] || die "the client could not read the GPU's SM count without MPS"
say "GPU 0 has $FULL_SM SMs."

# ================================================================ mpsd ==
heading "2. mpsd with two groups on GPU 0"
# K8S=1: root, with unshare and mount: gamma, served to a (missing) kubelet,
# for step 6. Its daemon needs root to get its private /dev/shm.
K8S=0
KFLAGS=()
if ((UID_NOW == 0)) && command -v unshare >/dev/null 2>&1 && command -v mount >/dev/null 2>&1; then
	K8S=1
	KFLAGS=(--kubelet-device-plugin --kubelet-dir "$D/kubelet" --kubelet-groups gamma)
	say "and gamma, served to the kubelet device plugin (private /dev/shm; step 6)"
else
	note "step 6 (the Kubernetes mode's private /dev/shm) needs root, unshare and mount: skipped"
fi
# Step 8's group, delta: a short memory_grace, reconcile: terminate. Its
# clients run as LIM_UID: mpsd never ends root's processes, so as root that
# is a bare uid (GPU_CHECK_TENANT_UID, default 64850; no account needed).
LIM_GRACE_S=2
LIM_UID=$UID_NOW
((UID_NOW == 0)) && LIM_UID=${GPU_CHECK_TENANT_UID:-64850}
LIM_USERS="\"$UID_NOW\""
((LIM_UID != UID_NOW)) && LIM_USERS+=", \"$LIM_UID\""
write_config() {
	{
		cat <<EOF
version: 1
socket: $D/mpsd.sock
run_dir: $BASE/run
state_dir: $D/state
log_dir: $BASE/log
cgroup:
$CGROUP_YAML
metrics:
  listen: "127.0.0.1:0"
admins:
  users: ["$UID_NOW"]
groups:
  alpha:
    users: ["$UID_NOW"]
    gpus: ["0"]
    sm_percent: 100
    memory: 16G
    max_mem: 8G
    requeue_attempts: 2
  beta:
    users: ["$UID_NOW"]
    gpus: ["0"]
    sm_percent: 100
    memory: 16G
    max_mem: 8G
    requeue_attempts: 2
  delta:
    users: [$LIM_USERS]
    gpus: ["0"]
    sm_percent: 100
    memory: 16G
    max_mem: 8G
    memory_grace: ${LIM_GRACE_S}s
    reconcile: terminate
EOF
		if ((K8S)); then
			cat <<EOF
  gamma:
    users: ["$UID_NOW"]
    gpus: ["0"]
    sm_percent: 100
    memory: 16G
    max_mem: 8G
EOF
		fi
		if [[ $DRY == 1 ]]; then
			cat <<EOF
mps:
  compute_mode: leave
simulate:
  gpus: 1
  model: h200-141g
  emulator_dir: $EMU
EOF
		else
			local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
			[[ :$path: == *":$CTL_DIR:"* ]] || path=$CTL_DIR:$path
			cat <<EOF
mps:
  control: $CTL
  path: $path
  compute_mode: leave
EOF
		fi
	} >"$D/mpsd.yaml"
}
SIMFLAG=()
[[ $DRY == 1 ]] && SIMFLAG=(--simulate)

start_mpsd() {
	local t
	# <run_dir>/alpha/GPU-<36>/pipe/control_privileged
	((${#BASE} + 70 <= 107)) || die "$BASE is too long for MPS's socket paths"
	write_config
	t=$(now)
	"$BIN/mpsd" --config "$D/mpsd.yaml" "${SIMFLAG[@]}" "${KFLAGS[@]}" >"$D/mpsd.log" 2>&1 &
	MPSD_PID=$!
	local until=$((SECONDS + 60))
	until st_ready; do
		kill -0 "$MPSD_PID" 2>/dev/null || return 1
		((SECONDS < until)) || die "mpsd did not bring both instances up within 60 s"
		sleep 0.1
	done
	timing "mpsd start to both instances ready" "$(dt "$t")"
}

show "mpsctl check-config ${SIMFLAG[*]:+${SIMFLAG[*]} }mpsd.yaml"
write_config
"$BIN/mpsctl" check-config "${SIMFLAG[@]}" "$D/mpsd.yaml"
sed -n '/^groups:/,$p' "$D/mpsd.yaml" | sed 's/^/  /'
show "mpsd --config mpsd.yaml ${SIMFLAG[*]:+${SIMFLAG[*]} }${KFLAGS[*]:+${KFLAGS[*]} }&"
if ! start_mpsd; then
	wait "$MPSD_PID" 2>/dev/null
	if grep -q 'POSIX ACLs' "$D/mpsd.log" && [[ -d /dev/shm ]]; then
		note "$(stat -fc %T "$D") under $D has no POSIX ACLs; run_dir and log_dir move to /dev/shm"
		if ((K8S)); then
			# A daemon's private /dev/shm would hide its own directories.
			note "step 6 skipped: with run_dir under /dev/shm, mpsd refuses a private /dev/shm"
			K8S=0
			KFLAGS=()
		fi
		ALT_BASE=$(mktemp -d /dev/shm/gck.XXXXXX) || die "mktemp in /dev/shm"
		chmod 755 "$ALT_BASE"
		BASE=$ALT_BASE
		start_mpsd || die "mpsd did not start"
	else
		die "mpsd did not start"
	fi
fi
METRICS=$(sed -n 's/.*msg="metrics served" address=\([^ ]*\).*/\1/p' "$D/mpsd.log" | head -n 1)
say "mpsd pid $MPSD_PID; metrics on ${METRICS:-(none)}"
show "mpsctl status"
"$BIN/mpsctl" status

# ============================================================== limits ==
heading "3. Limits inside a client"
# limits NAME GROUP SM MEM MEM_MIB ALLOC_GIB DURATION
limits() {
	local name=$1 group=$2 sm=$3 mem=$4 mem_mib=$5 alloc=$6 dur=$7 t rc=0 got sms stopped want lo hi
	t=$(now)
	show "mps-launch --group $group --sm $sm --mem $mem -- gpu_check_client --alloc $alloc --duration $dur"
	timeout -k 5 90 "$BIN/mps-launch" --group "$group" --sm "$sm" --mem "$mem" --wait 60s -- \
		"$CLIENT" --alloc "$alloc" --duration "$dur" </dev/null >"$D/clients/$name.log" 2>&1 || rc=$?
	print_log "$name"
	say "  [$name] exit status $rc"
	timing "$name: launch to exit (${dur} s of kernels)" "$(dt "$t")"
	sms=$(field "$name" sm_count ' ready ')
	got=$(field "$name" got_mib ' alloc ')
	want=$(field "$name" requested_mib ' alloc ')
	stopped=$(field "$name" stopped ' alloc ')
	if ((rc == 0)); then
		pass "$name: the client ran under mps-launch and exited 0"
	else
		fail "$name: the client exited $rc"
	fi
	# MPS rounds the share down to whole TPCs (2 SMs on Hopper): 25% of 132 is 32.
	lo=$(((FULL_SM * sm - 1) / 100 - 4))
	hi=$(((FULL_SM * sm + 99) / 100))
	if [[ $sms =~ ^[0-9]+$ ]] && ((sms >= lo && sms <= hi && sms < FULL_SM)); then
		pass "$name: --sm $sm: the client sees $sms of $FULL_SM SMs ($(awk -v a="$sms" -v b="$FULL_SM" 'BEGIN { printf "%.1f", 100 * a / b }')%; expected $lo-$hi)"
	else
		fail "$name: --sm $sm: the client sees ${sms:-no} SM count of $FULL_SM (expected $lo-$hi)"
	fi
	# The pinned limit counts the context too (about 271 MiB): a 4096M
	# limit let 3584 MiB of 256 MiB chunks through on the H200, a 1G one
	# 512 MiB (docs/gpu-probe).
	lo=$((mem_mib > 1024 ? mem_mib - 768 : mem_mib / 4))
	if [[ $got =~ ^[0-9]+$ && $stopped == yes ]] && ((got < mem_mib && got >= lo)); then
		pass "$name: --mem $mem: allocation stopped at $got MiB of $want MiB asked (error $(grep ' alloc ' "$D/clients/$name.log" | grep -o 'error=.*' | head -n 1 | cut -d= -f2-))"
	else
		fail "$name: --mem $mem: allocation got ${got:-?} MiB of ${want:-?} MiB asked, stopped=${stopped:-?} (expected to stop between $lo and $mem_mib MiB)"
	fi
}
need_mpsd
limits limits-alpha alpha 25 2G 2048 4 2
need_mpsd
limits limits-beta beta 50 1G 1024 2 1
need_mpsd
# A launcher exits with its command; mpsd releases the lease a moment
# later. Step 4's snapshots of each group's pids must not see the limit
# checks' leases.
limit_leases_gone() { [[ -z $(st_pids alpha) && -z $(st_pids beta) ]]; }
wait_until 30 "the limit checks' leases released" limit_leases_gone ||
	die "the limit checks' leases were still running 30 s after their launchers exited"

# =========================================================== isolation ==
heading "4. A fault in alpha; beta runs on"
say "Two long clients in beta, two in alpha; one of alpha's faults (illegal"
say "address) about 5 s after it is ready. Real MPS puts a sticky error on every"
say "client of the faulting server: alpha's, not beta's (their own server)."
# The restarts before the fault: taken before the clients start, since the
# fault comes 5 s after alpha-fault is ready, which a loaded host can reach
# before the four are seen ready.
A_RESTARTS=$(st_inst alpha restarts)
B_RESTARTS=$(st_inst beta restarts)
launch beta-1 beta 25 2G "$CLIENT" --duration 20
launch beta-2 beta 25 2G "$CLIENT" --duration 20
launch alpha-1 alpha 25 2G "$CLIENT" --duration 15
launch alpha-fault alpha 10 1G "$FAULT" --after 5 --duration 3
all_ready() {
	local n
	for n in beta-1 beta-2 alpha-1 alpha-fault; do
		has "$n" ' ready t=' || return 1
	done
}
wait_until 60 "the four clients" all_ready || {
	for n in beta-1 beta-2 alpha-1 alpha-fault; do print_log "$n"; done
	die "the four clients were not all ready within 60 s"
}
T_READY=$(now)
B_PIDS=$(st_pids beta)
A_PIDS=$(st_pids alpha)
B_SERVER=$(st_inst beta server_pids)
B_DAEMON=$(st_inst beta daemon_pid)
A_SERVER=$(st_inst alpha server_pids)
say "all four ready; beta's lease pids: $B_PIDS (server $B_SERVER, daemon $B_DAEMON); alpha's: $A_PIDS (server $A_SERVER)"
show "mpsctl status"
"$BIN/mpsctl" status
if [[ $DRY == 0 ]]; then
	show "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
	nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | sed 's/^/  /'
fi
if [[ -n $A_SERVER && -n $B_SERVER && $A_SERVER != "$B_SERVER" ]]; then
	pass "both groups' MPS servers run side by side on GPU 0 (alpha $A_SERVER, beta $B_SERVER; compute mode $CMODE_BEFORE)"
else
	fail "expected one MPS server per group on GPU 0, got alpha '${A_SERVER}' and beta '${B_SERVER}'"
fi

# The timeline, polled every 50 ms; the clients' own t= stamps where they
# have them.
T_FAULT='' T_ERR='' T_REVOKED='' T_REQ1='' T_REQF='' T_RUN1='' T_RUNF=''
# How long alpha's server stays FAULT (get_server_status, polled with the
# timeline): the emulator's MPSEMU_FAULT_RESET (default 0) stands for it.
A_PIPE=$(find "$BASE/run" -type d -name pipe -path '*alpha*' 2>/dev/null | head -n 1)
T_SFAULT='' T_SEND='' S_END=''
fault_state() { echo "get_server_status ${A_SERVER%% *}" | CUDA_MPS_PIPE_DIRECTORY=$A_PIPE timeout 2 "$CTL" 2>/dev/null; }
until=$((SECONDS + 60))
while ((SECONDS < until)); do
	tn=$(now)
	if [[ -n $A_PIPE && -n $A_SERVER && -z $T_SEND ]]; then
		s=$(fault_state)
		if [[ $s == FAULT ]]; then
			[[ -n $T_SFAULT ]] || T_SFAULT=$tn
		elif [[ -n $T_SFAULT ]]; then
			T_SEND=$tn S_END=${s:-no answer}
		fi
	fi
	if [[ -z $T_FAULT ]] && has alpha-fault 'faulting now'; then
		T_FAULT=$(field alpha-fault t 'faulting now')
		[[ -n $T_FAULT ]] || T_FAULT=$tn
	fi
	if [[ -z $T_ERR ]] && { has alpha-1 ' error t=' || has alpha-1 'cuda error\|CUDA error\|IllegalAddress'; }; then
		T_ERR=$(field alpha-1 t ' error t=')
		[[ -n $T_ERR ]] || T_ERR=$tn
	fi
	[[ -z $T_REVOKED ]] && { has alpha-1 'revoked' || has alpha-fault 'revoked'; } && T_REVOKED=$tn
	[[ -z $T_REQ1 ]] && has alpha-1 'requeued, attempt 2' && T_REQ1=$tn
	[[ -z $T_REQF ]] && has alpha-fault 'requeued, attempt 2' && T_REQF=$tn
	if [[ -z $T_RUN1 ]] && has alpha-1 'ready t=.* attempt=2'; then
		T_RUN1=$(field alpha-1 t 'ready t=.* attempt=2')
	fi
	if [[ -z $T_RUNF ]] && has alpha-fault 'ready t=.* attempt=2'; then
		T_RUNF=$(field alpha-fault t 'ready t=.* attempt=2')
	fi
	[[ -n $T_RUN1 && -n $T_RUNF ]] && break
	# Both of alpha's launchers gone without a second run: nothing more to see.
	if ! kill -0 "${LPID[alpha-1]}" 2>/dev/null && ! kill -0 "${LPID[alpha-fault]}" 2>/dev/null; then
		break
	fi
	need_mpsd
	sleep 0.05
done
# A FAULT window that outlasts the timeline: followed a little longer.
until=$((SECONDS + 10))
while [[ -n $T_SFAULT && -z $T_SEND ]] && ((SECONDS < until)); do
	s=$(fault_state)
	[[ $s == FAULT ]] || { T_SEND=$(now) S_END=${s:-no answer}; }
	sleep 0.05
done
B_PIDS_AFTER=$(st_pids beta)
B_ALIVE=1
for p in $B_PIDS; do
	kill -0 "$p" 2>/dev/null || B_ALIVE=0
done
show "mpsctl status   # after alpha's relaunch"
"$BIN/mpsctl" status
if [[ -n $T_FAULT ]]; then
	say "fault at t=$T_FAULT ($(dt "$T_READY" "$T_FAULT") s after all four were ready)"
else
	say "the fault program never reported its fault"
fi
[[ -n $T_FAULT && -n $T_ERR ]] && timing "fault -> alpha-1 sees its CUDA error" "$(dt "$T_FAULT" "$T_ERR")"
if [[ -n $T_SEND ]]; then
	timing "alpha's server FAULT -> '$S_END' (get_server_status, polled; mpsd's recovery may end it first)" "$(dt "$T_SFAULT" "$T_SEND")"
else
	say "alpha's server FAULT duration: not measured (seen FAULT: ${T_SFAULT:-never}; pipe ${A_PIPE:-not found}, server ${A_SERVER:-unknown})"
fi
if [[ -n $T_FAULT ]]; then
	T_DETECT=$(mpsd_log_time 'msg="instance failed; recovering" group=alpha')
	[[ -n $T_DETECT ]] && timing "fault -> mpsd starts alpha's recovery (mpsd.log)" "$(dt "$T_FAULT" "$T_DETECT")"
	took=$(grep -m1 'msg="revocation done" group=alpha' "$D/mpsd.log" | grep -o 'took=[^ ]*' | cut -d= -f2)
	[[ -n $took ]] && say "mpsd: revoking and requeueing alpha's leases took $took (mpsd.log)"
fi
# mpsd acts on a server's fault record only when an NVML Xid on the GPU
# matches it (docs/security.md, rule 3): what the driver reported, and when.
T_XID=$(mpsd_log_time 'msg="GPU Xid"')
xid_line=$(grep -m1 'msg="GPU Xid"' "$D/mpsd.log" | grep -o 'xid=[0-9]* level=[a-z]* pid=[0-9]*')
if [[ -n $T_XID ]]; then
	note "RECORD: NVML reported ${xid_line:-an Xid} for the client's fault"
	[[ -n $T_FAULT ]] && timing "fault -> NVML's Xid reaches mpsd (mpsd.log)" "$(dt "$T_FAULT" "$T_XID")"
else
	note "RECORD: NVML reported no Xid for the client's fault: mpsd cannot confirm the server's fault record"
fi
if grep -q 'msg="MPS fault record confirmed by an Xid".*group=alpha' "$D/mpsd.log"; then
	note "RECORD: alpha's fault record was confirmed by the Xid"
elif grep -q 'MPS log record not acted on.*group=alpha' "$D/mpsd.log"; then
	note "RECORD: alpha's fault record was NOT confirmed: $(grep -m1 -o 'why="[^"]*"' "$D/mpsd.log")"
fi
[[ -n $T_FAULT && -n $T_REVOKED ]] && timing "fault -> a launcher prints 'revoked' (polled)" "$(dt "$T_FAULT" "$T_REVOKED")"
[[ -n $T_FAULT && -n $T_REQ1 ]] && timing "fault -> alpha-1 prints 'requeued' (polled)" "$(dt "$T_FAULT" "$T_REQ1")"
[[ -n $T_FAULT && -n $T_REQF ]] && timing "fault -> alpha-fault prints 'requeued' (polled)" "$(dt "$T_FAULT" "$T_REQF")"
[[ -n $T_FAULT && -n $T_RUN1 ]] && timing "fault -> alpha-1 running again (attempt 2)" "$(dt "$T_FAULT" "$T_RUN1")"
[[ -n $T_FAULT && -n $T_RUNF ]] && timing "fault -> alpha-fault running again (attempt 2)" "$(dt "$T_FAULT" "$T_RUNF")"

if [[ -n $B_PIDS && $B_PIDS_AFTER == "$B_PIDS" && $B_ALIVE == 1 ]]; then
	pass "after the fault beta's clients still run with the same pids ($B_PIDS, mpsctl status)"
else
	fail "beta's lease pids were '$B_PIDS' before the fault and are '$B_PIDS_AFTER' after (all alive: $B_ALIVE)"
fi

say
say "Waiting for the clients to finish..."
for n in beta-1 beta-2 alpha-1 alpha-fault; do
	finish "$n" 60
done
for n in beta-1 beta-2 alpha-1 alpha-fault; do
	print_log "$n"
	say "  [$n] exit status ${RC[$n]}"
done
say
for n in beta-1 beta-2; do
	if ((RC[$n] == 0)) && ! has "$n" 'revoked' && [[ $(ready_count "$n") == 1 ]]; then
		pass "$n: untouched: one run, no revocation, exit status 0"
	else
		fail "$n: disturbed: exit status ${RC[$n]}, $(ready_count "$n") run(s)$(has "$n" revoked && echo ', revoked')"
	fi
done
for n in alpha-1 alpha-fault; do
	if has "$n" 'requeued, attempt 2' && ((RC[$n] == 0)); then
		pass "$n: revoked, requeued (attempt 2) and finished with exit status 0"
	else
		fail "$n: expected 'requeued, attempt 2' and exit status 0; got exit status ${RC[$n]}$(has "$n" 'requeued, attempt 2' || echo ', no requeue')"
	fi
done
has alpha-1 'cuda error 700\|CUDA error 700' && say "alpha-1 got the sticky error: $(grep -m1 -i -o 'cuda error 700 [A-Za-z]*' "$D/clients/alpha-1.log")"
reason=$(grep -m1 -o 'revoked (.*); requeued' "$D/clients/alpha-1.log" 2>/dev/null)
[[ -n $reason ]] && say "mpsd's reason, as alpha-1's launcher printed it: ${reason%; requeued}"
B_SERVER_NOW=$(st_inst beta server_pids)
B_DAEMON_NOW=$(st_inst beta daemon_pid)
B_RESTARTS_NOW=$(st_inst beta restarts)
A_RESTARTS_NOW=$(st_inst alpha restarts)
if [[ $B_DAEMON_NOW == "$B_DAEMON" && $B_RESTARTS_NOW == "$B_RESTARTS" ]] && [[ -z $B_SERVER_NOW || $B_SERVER_NOW == "$B_SERVER" ]]; then
	if [[ -n $B_SERVER_NOW ]]; then how="still running"; else how="exited once idle"; fi
	pass "beta's instance: same control daemon ($B_DAEMON), server $B_SERVER $how, restarts $B_RESTARTS_NOW"
else
	fail "beta's instance changed: daemon $B_DAEMON -> $B_DAEMON_NOW, server $B_SERVER -> $B_SERVER_NOW, restarts $B_RESTARTS -> $B_RESTARTS_NOW"
fi
if [[ $A_RESTARTS_NOW =~ ^[0-9]+$ && $A_RESTARTS =~ ^[0-9]+$ ]] && ((A_RESTARTS_NOW > A_RESTARTS)); then
	pass "alpha's instance recovered: restarts $A_RESTARTS -> $A_RESTARTS_NOW, state $(st_inst alpha state)"
else
	fail "alpha's instance shows no recovery: restarts $A_RESTARTS -> $A_RESTARTS_NOW"
fi

# =============================================================== after ==
heading "5. What mpsd and MPS recorded"
show "mpsd.log: faults, revocations, requeues, Xids"
grep -E 'instance failed|leases revoked|GPU Xid|probe failed|quarantined|restart failed|daemon restarted|level=ERROR' "$D/mpsd.log" |
	sed -E 's/ gpu=GPU-[0-9a-f-]+//; s/^/  /' | head -n 30
show "server.log lines about the fault"
find "$BASE/log" -name server.log -print0 2>/dev/null | while IFS= read -r -d '' f; do
	grep -h -E 'fatal|torn down|sticky' "$f" | sed "s|^|  ${f#"$BASE"/log/}: |" | head -n 12
done
if [[ -n $METRICS ]]; then
	show "curl http://$METRICS/metrics | grep -E 'mpsd_(faults|server_restarts|requeues|gpu_xid_errors)_total' (non-zero; gpu labels cut)"
	metrics=$(http_get /metrics 2>/dev/null)
	if [[ -n $metrics ]]; then
		grep -E '^mpsd_(faults_total|server_restarts_total|requeues_total|gpu_xid_errors_total)\{' <<<"$metrics" |
			awk '$NF != 0' | sed -E 's/gpu="GPU-[0-9a-f-]+",//; s/^/  /'
		if grep -E '^mpsd_faults_total\{' <<<"$metrics" | grep 'group="alpha"' | awk '$NF != 0' | grep -q .; then
			pass "mpsd_faults_total counts alpha's fault"
		else
			fail "mpsd_faults_total shows no fault for alpha"
		fi
		if grep -E '^mpsd_(faults|server_restarts)_total\{' <<<"$metrics" | grep 'group="beta"' | awk '$NF != 0' | grep -q .; then
			fail "the metrics show a fault or restart for beta"
		else
			pass "no fault and no restart counted for beta"
		fi
	else
		fail "could not read http://$METRICS/metrics"
	fi
fi
if [[ $DRY == 0 ]]; then
	CMODE_AFTER=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader 2>/dev/null)
	if [[ $CMODE_AFTER == "$CMODE_BEFORE" ]]; then
		pass "GPU 0's compute mode is unchanged ($CMODE_AFTER)"
	else
		fail "GPU 0's compute mode changed: $CMODE_BEFORE -> $CMODE_AFTER"
	fi
fi

# ========================================================== kubernetes ==
# podview SHM PIPE COMMAND...: run COMMAND in a mount namespace of its own
# with a pod's mounts as the device plugin's Allocate gives them (the pipe
# directory at its own path, so only the masks and /dev/shm change).
podview() {
	local shm=$1 pipe=$2
	shift 2
	# shellcheck disable=SC2016 # expanded by the inner shell
	unshare --mount --propagation slave sh -c '
		set -e
		shm=$1 pipe=$2
		shift 2
		mount --bind "$shm" /dev/shm
		mount --bind "$pipe" "$pipe"
		mount -o remount,bind,ro "$pipe"
		for f in "$pipe/log" "$pipe/nvidia-cuda-mps-control.pid" "$pipe/control_lock"; do
			[ -e "$f" ] || continue
			mount --bind /dev/null "$f"
			mount -o remount,bind,ro "$f"
		done
		exec "$@"' sh "$shm" "$pipe" "$@"
}
if ((K8S)); then
	heading "6. Kubernetes mode: gamma's private /dev/shm"
	need_mpsd
	G_DIR=$(find "$BASE/run/gamma" -mindepth 1 -maxdepth 1 -name 'GPU-*' 2>/dev/null | head -n 1)
	G_PIPE=$G_DIR/pipe
	G_SHM=$G_DIR/shm
	G_DAEMON=$(st_inst gamma daemon_pid)
	say "gamma: pipe $G_PIPE, shm $G_SHM, daemon $G_DAEMON"
	if [[ -n $G_DIR && -d $G_SHM && $(stat -c '%a %u' "$G_SHM") == "1777 0" && -n $G_DAEMON &&
		$(stat -Lc '%d:%i' "/proc/$G_DAEMON/root/dev/shm" 2>/dev/null) == "$(stat -c '%d:%i' "$G_SHM")" &&
		$(readlink "/proc/$G_DAEMON/ns/mnt") != "$(readlink /proc/$$/ns/mnt)" ]]; then
		pass "gamma's MPS daemon $G_DAEMON runs in its own mount namespace with $G_SHM (root, 1777) as /dev/shm"
	else
		fail "gamma's MPS daemon ${G_DAEMON:-?}: /dev/shm is not ${G_SHM:-?} in a namespace of its own"
	fi
	grep -E ' /dev/shm ' "/proc/$G_DAEMON/mountinfo" 2>/dev/null | sed 's/^/  daemon mountinfo: /'
	if [[ $(stat -c '%d:%i' /dev/shm) == "$(stat -c '%d:%i' "$G_SHM" 2>/dev/null)" ]]; then
		fail "this shell's /dev/shm is gamma's: the private mount leaked"
	fi

	# A pod's client: its Allocate mounts, its environment from mps-launch.
	t=$(now)
	show "unshare --mount (a pod's mounts) mps-launch --group gamma --sm 25 --mem 2G -- gpu_check_client --duration 2   # k8s-pod"
	rc=0
	podview "$G_SHM" "$G_PIPE" timeout -k 5 90 "$BIN/mps-launch" --group gamma --sm 25 --mem 2G --wait 60s -- \
		"$CLIENT" --duration 2 </dev/null >"$D/clients/k8s-pod.log" 2>&1 || rc=$?
	print_log k8s-pod
	timing "k8s-pod: launch to exit (2 s of kernels)" "$(dt "$t")"
	G_SERVER=$(st_inst gamma server_pids)
	sms=$(field k8s-pod sm_count ' ready ')
	if ((rc == 0)) && [[ $sms =~ ^[0-9]+$ ]] && ((sms < FULL_SM)); then
		pass "a client with only a pod's mounts reached gamma's MPS server ${G_SERVER:-?} and ran with $sms of $FULL_SM SMs"
	else
		fail "a client with only a pod's mounts: exit status $rc, SMs ${sms:-none}: the pod's mounts do not reach the server"
	fi
	for p in $G_SERVER; do
		if [[ $(stat -Lc '%d:%i' "/proc/$p/root/dev/shm" 2>/dev/null) == "$(stat -c '%d:%i' "$G_SHM")" ]]; then
			pass "gamma's MPS server $p has $G_SHM as /dev/shm"
		else
			fail "gamma's MPS server $p: /dev/shm is not $G_SHM"
		fi
	done
	say "  gamma's shm directory after the pod's client: $(find "$G_SHM" -mindepth 1 2>/dev/null | wc -l) entries"

	# A client on the host, with the host's /dev/shm: recorded, not judged.
	t=$(now)
	show "mps-launch --group gamma --sm 25 --mem 2G -- gpu_check_client --duration 2   # k8s-host (the host's /dev/shm)"
	rc=0
	timeout -k 5 45 "$BIN/mps-launch" --group gamma --sm 25 --mem 2G --wait 30s -- \
		"$CLIENT" --duration 2 </dev/null >"$D/clients/k8s-host.log" 2>&1 || rc=$?
	print_log k8s-host
	if has k8s-host ' ready t='; then how="reached the server and ran"; else how="did not get to run"; fi
	note "RECORD: a host client (the host's /dev/shm) of gamma's private-/dev/shm server: exit status $rc, $how, after $(dt "$t") s"
fi

# ========================================================== generation ==
# Step 7: versions, client priority and per-server caps (hack/gpu-check-mps.sh).
# shellcheck source=hack/gpu-check-mps.sh
. "$REPO/hack/gpu-check-mps.sh"

# ============================================================== limits ==
# Step 8: memory per lease as NVML and mpsd see it, the invalid-entry
# escape, an unleased client (hack/gpu-check-limits.sh).
# shellcheck source=hack/gpu-check-limits.sh
. "$REPO/hack/gpu-check-limits.sh"

# ============================================================= summary ==
heading "Summary$([[ $DRY == 1 ]] && echo ' (DRY RUN: simulated GPU; SM and memory figures made up by the stand-ins)')"
if [[ $DRY == 0 ]]; then
	say "GPU 0: $(nvidia-smi -i 0 --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null), $FULL_SM SMs; MPS $(readlink -f "$CTL")"
fi
for r in "${RESULTS[@]}"; do say "$r"; done
say
say "Timings:"
for r in "${TIMINGS[@]}"; do say "  $r"; done
say "  $(printf '%-52s %7s s' "total (before cleanup)" "$(dt "$T0")")"
say
SUMMARY_DONE=1
npass=$((${#RESULTS[@]} - NFAIL))
say "Result: $npass PASS, $NFAIL FAIL"
((NFAIL == 0))
