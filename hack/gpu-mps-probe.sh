#!/usr/bin/env bash
# Record what NVIDIA's real MPS does on a real GPU, for the facts the emulator
# copies but a GPU-less machine cannot show: server ACTIVE/FAULT states, the
# limits a client sees, allocation failures, fault propagation between
# clients, a SIGKILLed server under load, and the log lines of all of it.
#
# Usage (on a GPU host with the driver, nvcc and MPS installed):
#   hack/gpu-mps-probe.sh [OUTDIR]
# Needs: nvidia-cuda-mps-control and nvidia-cuda-mps-server on PATH (or
# MPS_CONTROL), nvcc (or CUDA_HOME/bin/nvcc). Uses GPU 0 only, in its own
# pipe/log directory; stops its daemon and servers however it ends.
# Every step is bounded by a timeout; the whole run takes about a minute.
set -u
out=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
w=$(mktemp -d)
exec > >(tee "$out/probe.txt") 2>&1

ctl=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || true)}
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
say() { printf '\n=== %s\n' "$*"; }
[ -x "$ctl" ] || { echo "nvidia-cuda-mps-control not found"; exit 1; }
[ -x "$nvcc" ] || { echo "nvcc not found"; exit 1; }

export CUDA_MPS_PIPE_DIRECTORY=$w/pipe CUDA_MPS_LOG_DIRECTORY=$w/log CUDA_VISIBLE_DEVICES=0
mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
mps() { echo "\$ $*"; echo "$*" | timeout 10 "$ctl"; echo "(exit $?)"; }
probe() { timeout "${T:-30}" "$w/mps_probe" "$@"; echo "(exit $?)"; }
servers() { echo get_server_list | timeout 5 "$ctl"; }

cleanup() {
	echo "quit -t 1" | timeout 10 "$ctl" >/dev/null 2>&1
	pkill -9 -f "$w/mps_probe" 2>/dev/null
	for p in $(pgrep -f nvidia-cuda-mps-server); do
		tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "CUDA_MPS_PIPE_DIRECTORY=$w/pipe" && kill -9 "$p"
	done
	cp -r "$w/log" "$out/mps-log" 2>/dev/null
	rm -rf "$w"
}
trap cleanup EXIT

say "host"
date -u
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode,mig.mode.current --format=csv
echo "control: $ctl ($(readlink -f "$ctl"))"
echo "server: $(command -v nvidia-cuda-mps-server)"
"$nvcc" --version | tail -n 2

say "compile probe"
t0=$(date +%s%N)
"$nvcc" -O2 -o "$w/mps_probe" "$here/cuda/mps_probe.cu" || exit 1
echo "compiled in $(( ($(date +%s%N) - t0) / 1000000 )) ms"

say "without MPS"
T=60 probe info

say "start daemon, defaults 50% and 4096M on device 0"
"$ctl" -d; echo "(exit $?)"
ls -l "$CUDA_MPS_PIPE_DIRECTORY"
mps get_server_list
mps set_default_active_thread_percentage 50
mps set_default_device_pinned_mem_limit 0 4096M
mps get_default_device_pinned_mem_limit 0

say "first client starts a server"
T=60 probe info
mps get_server_list
s=$(servers | head -n1)
mps get_server_status "$s"
mps get_active_thread_percentage "$s"
mps get_device_pinned_mem_limit "$s" 0
mps get_client_list "$s"

say "client env lowers (and cannot raise) the limits"
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 probe info
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=90 probe info
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G probe info
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G probe info

say "allocation past the pinned limit"
probe alloc 8192
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G probe alloc 2048

say "fault containment: three spinners, one faulting client"
# wait on these pids only: a bare `wait` would also wait for the tee above.
spinners=()
for i in 1 2 3; do (T=30 probe spin 8 >"$w/spin$i.txt" 2>&1) & spinners+=($!); done
sleep 3
mps get_client_list "$s"
probe fault
for i in $(seq 1 20); do echo "t+${i}00ms: $(echo "get_server_status $s" | timeout 5 "$ctl")"; sleep 0.1; done
echo "new client during fault:"
T=20 probe info
wait "${spinners[@]}"
for i in 1 2 3; do echo "spinner $i:"; cat "$w/spin$i.txt"; done
mps get_server_list
s=$(servers | head -n1)
mps get_server_status "$s"
echo "new client after the faulted clients exited:"
T=60 probe info

say "SIGKILL of the server under a running client"
(T=30 probe spin 8 >"$w/spink.txt" 2>&1) &
spinner=$!
sleep 3
s=$(servers | head -n1)
echo "kill -9 $s"; kill -9 "$s"
wait "$spinner"
cat "$w/spink.txt"
sleep 0.5
mps get_server_list

say "shutdown_server without clients, then quit"
T=60 probe info
s=$(servers | head -n1)
mps shutdown_server "$s"
sleep 1
mps get_server_list
mps "quit -t 2"
ls -l "$CUDA_MPS_PIPE_DIRECTORY" 2>&1

say "control.log"
cat "$CUDA_MPS_LOG_DIRECTORY/control.log"
say "server.log"
cat "$CUDA_MPS_LOG_DIRECTORY/server.log"
