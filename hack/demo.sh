#!/usr/bin/env bash
# hack/demo.sh: the whole idea of mpsd in well under a minute, on any Linux
# machine, with simulated GPUs and the MPS emulator (`make demo` runs it after
# `make build`).
#
# Two tenant groups, inference and batch, share two simulated GPUs with
# different budgets and per-client limits. Real mps-launch clients run the
# emulator's CUDA client in both groups; then one group's MPS server on GPU 0
# is SIGKILLed (its clients are requeued and finish, the other group's clients
# never notice), and GPU 1 reports Xid 79 (every instance on GPU 1 recovers,
# GPU 0 is untouched). mpsctl status and the metrics tell the story.
#
# As root, every lease gets its own cgroup (under mpsd-demo-<pid>); as an
# ordinary user cgroups are off. Everything lives in a fresh temporary
# directory, and everything the demo started is stopped on exit, error or
# Ctrl-C. Exit status: 0 when the story went as told, 1 otherwise.
#
# Needs: bin/ from `make build`, python3 or jq (to read `mpsctl status --json`);
# curl is used for the metrics when present.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$REPO/bin
EMU=$BIN/emu
START=$SECONDS

for b in "$BIN/mpsd" "$BIN/mpsctl" "$BIN/mps-launch" "$EMU/mpsemu-client" "$EMU/nvidia-cuda-mps-control" "$EMU/nvidia-cuda-mps-server"; do
	if [[ ! -x $b ]]; then
		echo "demo: $b is missing; run 'make demo' (or 'make build' first), which compiles it: a few minutes with an empty Go build cache, seconds after" >&2
		exit 1
	fi
done
if command -v python3 >/dev/null 2>&1; then
	JSON=python3
elif command -v jq >/dev/null 2>&1; then
	JSON=jq
else
	echo "demo: needs python3 or jq to read 'mpsctl status --json'" >&2
	exit 1
fi

# ---------------------------------------------------------------- output --
if [[ -t 1 ]]; then
	B=$'\e[1m' DIM=$'\e[2m' GRN=$'\e[32m' RED=$'\e[31m' OFF=$'\e[0m'
else
	B='' DIM='' GRN='' RED='' OFF=''
fi
heading() { printf '\n%s== %s ==%s\n' "$B" "$*" "$OFF"; }
say() { printf '%s\n' "$*"; }
run() { printf '%s$ %s%s\n' "$DIM" "$*" "$OFF"; "$@"; }
ok() { printf '%s  ✓ %s%s\n' "$GRN" "$*" "$OFF"; }
FAILED=0
bad() {
	printf '%s  ✗ %s%s\n' "$RED" "$*" "$OFF"
	FAILED=1
}
die() {
	printf '%sdemo: %s%s\n' "$RED" "$*" "$OFF" >&2
	if [[ -n ${D:-} && -f $D/mpsd.log ]]; then
		echo "--- last lines of mpsd's log ---" >&2
		tail -n 20 "$D/mpsd.log" >&2
	fi
	exit 1
}
# indent prefixes each line of a client's output with its name.
indent() { sed "s/^/  [$1] /" "$D/clients/$1.log"; }

# ------------------------------------------------------------- the place --
# MPS pipe directories hold unix sockets, whose paths have a 107-byte limit:
# <run_dir>/inference/GPU-<36>/pipe/control_privileged is run_dir + 75 bytes,
# so keep run_dir short even when TMPDIR is long.
D=$(mktemp -d "${TMPDIR:-/tmp}/mpsd-demo.XXXXXX")
if ((${#D} > 30)); then
	rmdir "$D"
	D=$(mktemp -d /tmp/mpsd-demo.XXXXXX)
fi
chmod 755 "$D" # the MPS daemons and servers run as the caller; keep it traversable
mkdir "$D/clients"
export MPSD_SOCKET=$D/mpsd.sock
USER_ID=$(id -u)
CGROUP_PARENT=mpsd-demo-$$
MPSD_PID=''
LAUNCHERS=()

# ---------------------------------------------------------------- cleanup --
# stop_pid sends TERM to pid if it is still the program it was (its
# executable is under this repository's bin/), waits up to 5 s, then KILLs.
stop_pid() {
	local pid=$1 exe
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 0
	[[ $exe == "$BIN"/* ]] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$? p pipe pids
	trap - EXIT INT TERM HUP
	set +eu
	# Launchers forward TERM to their workloads.
	for p in "${LAUNCHERS[@]}"; do
		stop_pid "$p"
	done
	# SIGTERM stops mpsd only: its MPS daemons run on by design (an upgrade
	# keeps clients), so quit them ourselves.
	if [[ -n $MPSD_PID ]]; then
		kill -TERM "$MPSD_PID" 2>/dev/null
		for _ in $(seq 100); do
			kill -0 "$MPSD_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$MPSD_PID" 2>/dev/null
		wait "$MPSD_PID" 2>/dev/null
	fi
	if [[ -d $D/run ]]; then
		while IFS= read -r pipe; do
			pids=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 5 "$EMU/nvidia-cuda-mps-control" 2>/dev/null)
			[[ -f $pipe/nvidia-cuda-mps-control.pid ]] && pids+=" $(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)"
			echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 "$EMU/nvidia-cuda-mps-control" >/dev/null 2>&1
			# A server or daemon that did not go with quit (hung, stopped).
			for p in $pids; do
				[[ $p =~ ^[0-9]+$ ]] && stop_pid "$p"
			done
		done < <(find "$D/run" -type d -name pipe 2>/dev/null)
	fi
	if ((USER_ID == 0)); then
		for p in /sys/fs/cgroup/"$CGROUP_PARENT" /sys/fs/cgroup/*/"$CGROUP_PARENT"; do
			[[ -d $p ]] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null
			[[ -d $p ]] && echo "demo: could not remove cgroup $p" >&2
		done
	fi
	rm -rf "$D"
	if ((rc == 0 && FAILED == 0)); then
		printf '\n%sDemo finished in %ds; mpsd, its MPS daemons and the temporary directory are gone.%s\n' "$B" $((SECONDS - START)) "$OFF"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM HUP

# ------------------------------------------------------------------- JSON --
# status prints `mpsctl status --json` to stdout.
status() { "$BIN/mpsctl" status --json; }

# instance GROUP GPU FIELD: one field of an instance; server_pids as a
# space-separated list. Fails when mpsd does not answer.
instance() {
	local st
	st=$(status 2>/dev/null) || return 1
	if [[ $JSON == python3 ]]; then
		python3 -c '
import json, sys
g, gpu, f = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in json.load(sys.stdin)["instances"]:
    if i["group"] == g and i["gpu_index"] == gpu:
        v = i.get(f)
        print(" ".join(map(str, v)) if isinstance(v, list) else v)
' "$1" "$2" "$3" <<<"$st"
	else
		jq -r --arg g "$1" --argjson gpu "$2" --arg f "$3" \
			'.instances[] | select(.group == $g and .gpu_index == $gpu) | .[$f] | if type == "array" then map(tostring) | join(" ") else tostring end' <<<"$st"
	fi
}

# need_mpsd: stop the story if mpsd is gone.
need_mpsd() { kill -0 "$MPSD_PID" 2>/dev/null || die "mpsd exited unexpectedly"; }

# all_ready: every instance is ready.
all_ready() {
	local st
	st=$(status 2>/dev/null) || return 1
	if [[ $JSON == python3 ]]; then
		python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s["instances"] and all(i["state"]=="ready" for i in s["instances"]) else 1)' <<<"$st"
	else
		jq -e '(.instances | length > 0) and all(.instances[]; .state == "ready")' >/dev/null <<<"$st"
	fi
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.1 s.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local until=$((SECONDS + limit))
	until "$@"; do
		((SECONDS < until)) || die "timed out after ${limit}s waiting for $what"
		kill -0 "$MPSD_PID" 2>/dev/null || die "mpsd exited while waiting for $what"
		sleep 0.1
	done
}

# recovered GROUP GPU RESTARTS: the instance restarted that often and is ready.
recovered() {
	[[ $(instance "$1" "$2" restarts) == "$3" && $(instance "$1" "$2" state) == ready ]]
}

# ------------------------------------------------------------- launchers --
# launch NAME GROUP SM MEM CLIENT-ARGS...: an mps-launch in the background,
# its output (the launcher's and the client's) in clients/NAME.log.
declare -A LPID
launch() {
	local name=$1 group=$2 sm=$3 mem=$4
	shift 4
	"$BIN/mps-launch" --group "$group" --sm "$sm" --mem "$mem" -- "$EMU/mpsemu-client" "$@" \
		>"$D/clients/$name.log" 2>&1 &
	LPID[$name]=$!
	LAUNCHERS+=($!)
	printf '%s$ mps-launch --group %s --sm %s --mem %s -- mpsemu-client %s &   # %s%s\n' \
		"$DIM" "$group" "$sm" "$mem" "$*" "$name" "$OFF"
}
# connected NAME...: each client reached its MPS server (it prints its limits
# once it has).
connected() {
	local n
	for n in "$@"; do
		grep -q 'server=' "$D/clients/$n.log" 2>/dev/null || return 1
	done
}
# finish NAME: wait for the launcher; print its output and exit status.
declare -A RC
finish() {
	local rc=0
	wait "${LPID[$1]}" || rc=$?
	RC[$1]=$rc
	indent "$1"
	say "  [$1] exit status $rc"
}
requeued() { grep -q 'requeued, attempt 2' "$D/clients/$1.log"; }
# client_pid NAME: the pid of the client's first run.
client_pid() { sed -n 's/^mpsemu-client: pid=\([0-9]*\) .*/\1/p' "$D/clients/$1.log" | head -n 1; }

# ------------------------------------------------------------------ start --
heading "mpsd demo: two tenant groups share two simulated GPUs"
say "Working directory: $D"
if ((USER_ID == 0)); then
	CGROUP="  enabled: true
  parent: $CGROUP_PARENT"
	say "Running as root: every lease gets its own cgroup under $CGROUP_PARENT."
else
	CGROUP="  enabled: false"
	say "Running as uid $USER_ID, not root: cgroup isolation is off (workloads are"
	say "not confined to per-lease cgroups). Run as root to see it on."
fi

# A free port for the metrics, chosen here so that the demo knows where to
# scrape; none found means no metrics listener.
free_port() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
		return
	fi
	local p
	for p in $(seq $((20000 + RANDOM % 20000)) 50 60000); do
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}
PORT=$(free_port)
METRICS=${PORT:+127.0.0.1:$PORT}

write_config() {
	cat >"$D/mpsd.yaml" <<EOF
version: 1
socket: $D/mpsd.sock
run_dir: $D/run
state_dir: $D/state
log_dir: $D/log
cgroup:
$CGROUP
metrics:
  listen: "$1"
# Quick probes and restarts, so the story fits in seconds.
watchdog:
  probe_interval: 500ms
  probe_timeout: 400ms
  probe_failures: 2
  backoff_initial: 100ms
  backoff_max: 2s
admins:
  users: ["$USER_ID"]
groups:
  # Latency-sensitive serving: 60% of each GPU's SMs and 16 GiB, at most
  # 40% and 8 GiB per client, first in line.
  inference:
    users: ["$USER_ID"]
    sm_percent: 60
    memory: 16G
    max_sm: 40
    max_mem: 8G
    priority: 10
    requeue_attempts: 3
  # Batch: the rest of the SMs and 8 GiB, small clients.
  batch:
    users: ["$USER_ID"]
    sm_percent: 40
    memory: 8G
    max_sm: 20
    max_mem: 4G
    requeue_attempts: 3
simulate:
  gpus: 2
  model: a100-40g
  emulator_dir: $EMU
EOF
}

start_mpsd() {
	"$BIN/mpsd" --config "$D/mpsd.yaml" --simulate >"$D/mpsd.log" 2>&1 &
	MPSD_PID=$!
	local until=$((SECONDS + 30))
	until all_ready; do
		kill -0 "$MPSD_PID" 2>/dev/null || return 1
		((SECONDS < until)) || die "mpsd did not bring its instances up within 30s"
		sleep 0.1
	done
}

write_config "$METRICS"
heading "The configuration ($D/mpsd.yaml)"
sed -n '/^groups:/,/^simulate:/p' "$D/mpsd.yaml" | sed '$d'
run "$BIN/mpsctl" check-config --simulate "$D/mpsd.yaml"

heading "Starting mpsd --simulate (2 mock A100 40GB, the MPS emulator)"
if ! start_mpsd; then
	wait "$MPSD_PID" 2>/dev/null || true
	if grep -q 'metrics listener' "$D/mpsd.log"; then
		say "(the metrics port $METRICS was taken; running without metrics)"
		METRICS=''
		write_config ''
		start_mpsd || die "mpsd did not start"
	else
		die "mpsd did not start"
	fi
fi
say "mpsd (pid $MPSD_PID) runs one MPS control daemon per GPU per group: 4 instances."
run "$BIN/mpsctl" status

# ------------------------------------------------------- act 1: admission --
heading "1. Clients in both groups, each with its own limits"
say "Each client prints what MPS enforces on it: sm= is its active thread"
say "percentage, mem0= its pinned device memory limit on GPU 0."
launch infer-1 inference 30 4G --alloc 2G --duration 6s
launch infer-2 inference 20 2G --duration 6s
launch batch-1 batch 10 2G --duration 8s
launch batch-2 batch 10 1G --duration 8s
wait_for 20 "the four clients to connect" connected infer-1 infer-2 batch-1 batch-2
for n in infer-1 infer-2 batch-1 batch-2; do indent "$n"; done
say
say "A request beyond a group's per-client limit is refused at once (exit 125):"
rc=0
run "$BIN/mps-launch" --group batch --sm 50 -- "$EMU/mpsemu-client" || rc=$?
if ((rc == 125)); then
	ok "refused with exit status 125"
else
	bad "expected exit status 125, got $rc"
fi
say
run "$BIN/mpsctl" status

# ------------------------------------------------------ act 2: a crash --
need_mpsd
heading "2. The inference MPS server on GPU 0 crashes"
VICTIM=$(instance inference 0 server_pids)
VICTIM=${VICTIM%% *}
[[ -n $VICTIM ]] || die "no inference server on GPU 0"
B0_SERVER=$(instance batch 0 server_pids)
B0_DAEMON=$(instance batch 0 daemon_pid)
B1_PID=$(client_pid batch-1) B2_PID=$(client_pid batch-2)
say "With plain MPS, one server per GPU: every client on GPU 0 would die now."
say "mpsd runs one server per group, so only inference's clients share this one."
run kill -KILL "$VICTIM"
wait_for 20 "inference on GPU 0 to recover" recovered inference 0 1
say "The watchdog saw the server die, revoked its leases, requeued them, and"
say "restarted the instance. Meanwhile, the clients run to their end:"
for n in infer-1 infer-2 batch-1 batch-2; do finish "$n"; done
need_mpsd
say
for n in infer-1 infer-2; do
	if requeued "$n" && ((RC[$n] == 0)); then
		ok "$n: requeued (attempt 2) and completed"
	else
		bad "$n: expected a requeue and exit status 0"
	fi
done
for n in batch-1 batch-2; do
	if ! requeued "$n" && ((RC[$n] == 0)) && [[ $(grep -c '^mpsemu-client: pid=' "$D/clients/$n.log") == 1 ]]; then
		ok "$n: untouched (one run, no requeue, exit status 0)"
	else
		bad "$n: was disturbed"
	fi
done
if [[ $(instance batch 0 server_pids) == "$B0_SERVER" && $(instance batch 0 daemon_pid) == "$B0_DAEMON" && $(instance batch 0 restarts) == 0 ]]; then
	ok "batch on GPU 0: same control daemon ($B0_DAEMON) and server ($B0_SERVER), clients $B1_PID and $B2_PID ran through, 0 restarts"
else
	bad "batch's instance on GPU 0 changed"
fi

# ---------------------------------------------------- act 3: an Xid --
need_mpsd
heading "3. GPU 1 falls off the bus (Xid 79)"
say "A device-level Xid touches every instance on its GPU, and nothing else."
launch batch-gpu0 batch 10 1G --duration 6s
wait_for 20 "batch-gpu0 to connect" connected batch-gpu0
say "Drain GPU 0 for a moment so that the next two clients land on GPU 1:"
run "$BIN/mpsctl" drain --gpu 0
launch infer-gpu1 inference 20 2G --duration 4s
launch batch-gpu1 batch 10 1G --duration 4s
wait_for 20 "the GPU 1 clients to connect" connected infer-gpu1 batch-gpu1
run "$BIN/mpsctl" resume --gpu 0
I1=$(instance inference 1 restarts)
B1=$(instance batch 1 restarts)
G0_SERVER=$(instance batch 0 server_pids)
run "$BIN/mpsctl" inject-xid 1 79
wait_for 20 "GPU 1's instances to recover" recovered inference 1 $((I1 + 1))
wait_for 20 "GPU 1's instances to recover" recovered batch 1 $((B1 + 1))
for n in infer-gpu1 batch-gpu1 batch-gpu0; do finish "$n"; done
need_mpsd
say
for n in infer-gpu1 batch-gpu1; do
	if requeued "$n" && ((RC[$n] == 0)); then
		ok "$n (GPU 1): requeued (attempt 2) and completed"
	else
		bad "$n: expected a requeue and exit status 0"
	fi
done
if ! requeued batch-gpu0 && ((RC[batch-gpu0] == 0)) && [[ $(instance batch 0 server_pids) == "$G0_SERVER" ]]; then
	ok "batch-gpu0 (GPU 0): untouched, same server ($G0_SERVER)"
else
	bad "batch-gpu0 on GPU 0 was disturbed"
fi

# ------------------------------------------------------------ the end --
need_mpsd
heading "After"
run "$BIN/mpsctl" status
if ((FAILED == 0)); then
	say
	say "RESTARTS: inference/0 once (the crash); inference/1 and batch/1 once (Xid 79);"
	say "batch/0 never restarted."
fi

heading "Metrics (non-zero samples)"
if [[ -n $METRICS ]] && command -v curl >/dev/null 2>&1; then
	printf '%s$ curl -s http://%s/metrics | grep ... (gpu UUID labels cut)%s\n' "$DIM" "$METRICS" "$OFF"
	curl -fsS "http://$METRICS/metrics" |
		grep -E '^mpsd_(server_restarts_total|faults_total|requeues_total|gpu_xid_errors_total)\{' |
		awk '$NF != 0' | sed -E 's/gpu="GPU-[0-9a-f-]+",//' || true
else
	say "(no metrics listener or no curl; from mpsctl status --json instead)"
	for g in inference batch; do
		for i in 0 1; do
			say "  $g on GPU $i: restarts $(instance "$g" "$i" restarts)"
		done
	done
fi

heading "What happened"
say "- Two groups shared two GPUs, each client held to its SM share and memory limit."
say "- A crash of inference's MPS server on GPU 0 took only inference's clients;"
say "  mpsd requeued them and they completed. batch, on the same GPU, never noticed."
say "- Xid 79 on GPU 1 restarted both groups' instances there and requeued their"
say "  clients; GPU 0 ran on."
if ((FAILED)); then
	printf '\n%sSome steps did not go as described (see ✗ above).%s\n' "$RED" "$OFF"
	exit 1
fi
