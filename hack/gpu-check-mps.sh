# shellcheck shell=bash
# hack/gpu-check-mps.sh: step 7 of hack/gpu-check.sh, sourced by it (it uses
# its helpers, $CTL, $CLIENT, $D, $DRY and the running mpsd). What MPS's
# generation offers and decides, which only an ACTIVE server shows:
#   a. the versions mpsd reports for alpha's instance (status, metrics);
#   b. the client priority mpsd hands a lease (CUDA_MPS_CLIENT_PRIORITY) and
#      clients run with either priority against a daemon of this script's
#      own (accepted: they reach the server and finish);
#   c. as root, the per-server caps of an ACTIVE server owned by a
#      non-root user: a stranger's and then the owner's attempt to lift the
#      server's thread percentage and pinned memory (set_active_thread_
#      percentage, set_device_pinned_mem_limit) and to end the owner's
#      client (terminate_client). NVIDIA's daemon answers "Server N not
#      found" to anyone for a pid that is no server, so its rules for a
#      real server show only here. The emulator's choice (the owner may,
#      the stranger may not: docs/emulator.md) is printed as CONFIRMED or
#      CONTRADICTED; a stranger who changes the caps FAILs.
# The daemon of (b) and (c) runs in $D/cp (pipe) and $D/cl (logs);
# caps_cleanup, called from gpu-check.sh's cleanup, quits it. The owner and
# the stranger are bare uids, no accounts needed: GPU_CHECK_OWNER_UID
# (default 64848) and GPU_CHECK_STRANGER_UID (64849); setpriv, else
# python3, switches to them.

CAPS_PIPE=$D/cp
CAPS_LOGS=$D/cl
CAPS_STARTED=0
CAPS_OWNER=${GPU_CHECK_OWNER_UID:-64848}
CAPS_STRANGER=${GPU_CHECK_STRANGER_UID:-64849}

# caps_ctl [UID] COMMAND...: one command to this step's daemon, as UID
# (default root).
caps_ctl() {
	local u=0
	[[ $1 =~ ^[0-9]+$ ]] && { u=$1; shift; }
	echo "$*" | caps_as "$u" env CUDA_MPS_PIPE_DIRECTORY="$CAPS_PIPE" timeout 10 "$CTL" 2>&1
}

# caps_as UID COMMAND...: run COMMAND as UID (and gid UID, no other
# groups); UID 0 runs it as this script does.
caps_as() {
	local u=$1
	shift
	if ((u == 0)); then
		"$@"
	elif command -v setpriv >/dev/null 2>&1; then
		setpriv --reuid="$u" --regid="$u" --clear-groups "$@"
	else
		python3 -c 'import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setgid(u); os.setuid(u); os.execvp(sys.argv[2], sys.argv[2:])' "$u" "$@"
	fi
}

# caps_client NAME UID [VAR=VALUE...]: a short client of this step's daemon
# as UID, its output in clients/NAME.log; CAPS_SMS is the SM count (GPU)
# or share (dry run: the emulator's client, which connects for real,
# where the stand-in's --info would not) it reports. Returns its status.
caps_client() {
	local name=$1 u=$2 rc=0
	shift 2
	if [[ $DRY == 1 ]]; then
		caps_as "$u" env "${CAPS_ENV[@]}" "$@" timeout -k 5 60 "$EMU/mpsemu-client" --duration 100ms </dev/null >"$D/clients/$name.log" 2>&1 || rc=$?
		CAPS_SMS="share $(field "$name" sm 'mpsemu-client:')%"
	else
		caps_as "$u" env "${CAPS_ENV[@]}" "$@" timeout -k 5 60 "$CLIENT" --info </dev/null >"$D/clients/$name.log" 2>&1 || rc=$?
		CAPS_SMS="$(field "$name" sm_count ' ready ') SMs"
	fi
	print_log "$name"
	return "$rc"
}

caps_cleanup() {
	((CAPS_STARTED)) || return 0
	local pids p
	pids=$(caps_ctl get_server_list)
	[[ -f $CAPS_PIPE/nvidia-cuda-mps-control.pid ]] && pids+=" $(cat "$CAPS_PIPE/nvidia-cuda-mps-control.pid" 2>/dev/null)"
	caps_ctl "quit -t 5" >/dev/null
	for _ in $(seq 100); do
		[[ -e $CAPS_PIPE/nvidia-cuda-mps-control.pid ]] || break
		sleep 0.1
	done
	for p in $pids; do
		if [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null && [[ $(cat "/proc/$p/comm" 2>/dev/null) == nvidia-cuda-mps* ]]; then
			kill -KILL "$p" 2>/dev/null && say "killed MPS process $p of step 7, which outlived quit"
		fi
	done
	CAPS_STARTED=0
	say "quit step 7's MPS control daemon ($CAPS_PIPE)"
}

heading "7. MPS generation: versions, client priority, per-server caps"
need_mpsd

# a. Versions.
A_DRIVER=$(st_inst alpha driver_version)
A_MPSV=$(st_inst alpha mps_version)
if [[ $PARSER == table ]]; then
	note "status is read from the table: the versions are not judged (python3 or jq needed)"
elif [[ -n $A_DRIVER && $A_DRIVER != None && $A_DRIVER != null ]]; then
	pass "mpsctl status names alpha's driver $A_DRIVER and MPS binary version ${A_MPSV:-none}"
else
	fail "mpsctl status names no driver version for alpha"
fi
if [[ $DRY == 0 ]]; then
	note "RECORD: nvidia-smi driver $(nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader 2>/dev/null); control.log: $(grep -h -m1 -o 'CUDA MPS Control binary version: [0-9]*' "$BASE"/log/alpha/*/control.log 2>/dev/null | head -n 1)"
fi
if [[ -n $METRICS ]]; then
	show "curl http://$METRICS/metrics | grep mpsd_mps_info"
	http_get /metrics 2>/dev/null | grep '^mpsd_mps_info' | sed -E 's/gpu="GPU-[0-9a-f-]+",//; s/^/  /'
fi

# b. Client priority: what mpsd hands alpha's lease (priority 0: normal).
show "mps-launch --group alpha -- sh -c 'echo \$CUDA_MPS_CLIENT_PRIORITY'"
# shellcheck disable=SC2016 # expanded by the lease's shell
prio=$(timeout -k 5 60 "$BIN/mps-launch" --group alpha --sm 10 --mem 1G --wait 30s -- /bin/sh -c 'echo "prio=${CUDA_MPS_CLIENT_PRIORITY-unset}"' </dev/null 2>&1)
say "  $prio"
drv_major=${A_DRIVER%%.*}
if [[ $drv_major =~ ^[0-9]+$ ]] && ((drv_major >= 535)); then
	if [[ $prio == *prio=0* ]]; then
		pass "a lease of alpha (priority 0) gets CUDA_MPS_CLIENT_PRIORITY=0 on driver $A_DRIVER"
	else
		fail "a lease of alpha on driver $A_DRIVER: expected CUDA_MPS_CLIENT_PRIORITY=0, got '$prio'"
	fi
else
	note "alpha's driver version '${A_DRIVER:-unknown}' is not known to be 535 or newer: priority not judged ('$prio')"
fi

if ((UID_NOW != 0)); then
	note "the client priority and per-server cap checks on a daemon of this step's own need root (servers for other uids): skipped"
	return 0
fi

mkdir -p "$CAPS_PIPE" "$CAPS_LOGS"
rmdir "$CAPS_PIPE" # the daemon makes it
CAPS_ENV=(CUDA_MPS_PIPE_DIRECTORY="$CAPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$CAPS_LOGS")
if [[ $DRY == 1 ]]; then
	# The emulator as the H200's driver, its servers on PATH.
	CAPS_ENV+=(MPSEMU_DRIVER=580 PATH="$EMU:$PATH")
else
	CAPS_ENV+=(PATH="$(dirname "$CTL"):$PATH")
fi
show "nvidia-cuda-mps-control -d   # step 7's own daemon, pipe $CAPS_PIPE"
env "${CAPS_ENV[@]}" "$CTL" -d || {
	fail "step 7's MPS control daemon did not start"
	return 0
}
CAPS_STARTED=1
say "  $(caps_ctl set_default_active_thread_percentage 50)"
caps_ctl set_default_device_pinned_mem_limit 0 4096M >/dev/null
say "  defaults: $(caps_ctl get_default_active_thread_percentage)% and $(caps_ctl get_default_device_pinned_mem_limit 0) pinned on device 0"

# b (cont). Clients with each priority reach the server and finish.
for p in 0 1; do
	show "CUDA_MPS_CLIENT_PRIORITY=$p gpu_check_client --info   # root's server"
	rc=0
	caps_client "prio-$p" 0 CUDA_MPS_CLIENT_PRIORITY=$p || rc=$?
	if ((rc == 0)) && [[ $CAPS_SMS != " SMs" && $CAPS_SMS != "share %" ]]; then
		pass "a client with CUDA_MPS_CLIENT_PRIORITY=$p ran under MPS ($CAPS_SMS)"
	else
		fail "a client with CUDA_MPS_CLIENT_PRIORITY=$p: exit status $rc ($CAPS_SMS)"
	fi
done
grep -h 'Priority' "$CAPS_LOGS/server.log" 2>/dev/null | sed 's/^/  server.log: /' | head -n 4

# c. Per-server caps of an ACTIVE server owned by a non-root user. The
# root server of (b) goes first: a server of another uid waits for it.
caps_ctl "shutdown_server $(caps_ctl get_server_list | head -n 1)" >/dev/null
for _ in $(seq 100); do
	[[ -z $(caps_ctl get_server_list) ]] && break
	sleep 0.1
done
show "gpu_check_client --duration 30 as uid $CAPS_OWNER &   # the server's owner"
caps_as "$CAPS_OWNER" env "${CAPS_ENV[@]}" "$CLIENT" --duration 30 </dev/null >"$D/clients/caps-owner.log" 2>&1 &
CAPS_JOB=$!
S=''
for _ in $(seq 300); do
	S=$(caps_ctl get_server_list | head -n 1)
	[[ $S =~ ^[0-9]+$ && $(caps_ctl get_server_status "$S") == ACTIVE ]] && has caps-owner ' ready ' && break
	S=''
	sleep 0.1
done
if [[ -z $S ]]; then
	print_log caps-owner
	fail "no ACTIVE server for uid $CAPS_OWNER within 30 s: per-server caps not checked"
else
	# The client as MPS knows it (the background job's pid is a shell's).
	CAPS_CLIENT=$(caps_ctl get_client_list "$S" | head -n 1)
	say "server $S (uid $(stat -c %u "/proc/$S" 2>/dev/null)) is ACTIVE with client ${CAPS_CLIENT:-none}, $(caps_ctl get_active_thread_percentage "$S")% and $(caps_ctl get_device_pinned_mem_limit "$S" 0) pinned"
	caps_try() { # caps_try WHO UID: lift the caps as UID, then read them as root
		local who=$1 u=$2
		show "echo set_active_thread_percentage $S 100 | nvidia-cuda-mps-control   # as $who (uid $u)"
		say "  $(caps_ctl "$u" set_active_thread_percentage "$S" 100 | tr '\n' ' ')"
		show "echo set_device_pinned_mem_limit $S 0 80G | nvidia-cuda-mps-control   # as $who"
		say "  $(caps_ctl "$u" set_device_pinned_mem_limit "$S" 0 80G | tr '\n' ' ')"
		CAPS_SM=$(caps_ctl get_active_thread_percentage "$S")
		CAPS_MEM=$(caps_ctl get_device_pinned_mem_limit "$S" 0)
		say "  now: $CAPS_SM% and $CAPS_MEM pinned"
	}
	caps_try stranger "$CAPS_STRANGER"
	if [[ $CAPS_SM == 50.0 && $CAPS_MEM == 4G ]]; then
		pass "a stranger (uid $CAPS_STRANGER) cannot lift the caps of uid $CAPS_OWNER's server (still 50.0% and 4G)"
	else
		fail "a stranger (uid $CAPS_STRANGER) changed uid $CAPS_OWNER's server caps to $CAPS_SM% and $CAPS_MEM"
	fi
	show "echo terminate_client $S $CAPS_CLIENT | nvidia-cuda-mps-control   # as the stranger"
	say "  $(caps_ctl "$CAPS_STRANGER" terminate_client "$S" "$CAPS_CLIENT" | tr '\n' ' ')"
	caps_try owner "$CAPS_OWNER"
	if [[ $DRY == 1 ]]; then
		note "RECORD (dry run: the emulator's own choice, nothing to confirm): the owner's attempt left $CAPS_SM% and $CAPS_MEM"
	elif [[ $CAPS_SM == 100.0 && $CAPS_MEM != 4G ]]; then
		note "RECORD: CONFIRMED the emulator's choice: the server's owner lifted its own caps ($CAPS_SM%, $CAPS_MEM)"
	else
		note "RECORD: CONTRADICTED the emulator's choice (docs/emulator.md): the owner's attempt left $CAPS_SM% and $CAPS_MEM"
	fi
	show "gpu_check_client --info as uid $CAPS_OWNER   # a new client of the lifted server"
	caps_client caps-after "$CAPS_OWNER"
	note "RECORD: a new client of the owner's server after its attempt sees $CAPS_SMS (50% before)"
	show "echo terminate_client $S <pid> | nvidia-cuda-mps-control   # as the owner"
	say "  $(caps_ctl "$CAPS_OWNER" terminate_client "$S" "$CAPS_CLIENT" | tr '\n' ' ')"
fi
[[ $CAPS_CLIENT =~ ^[0-9]+$ ]] && kill -TERM "$CAPS_CLIENT" 2>/dev/null
kill -TERM "$CAPS_JOB" 2>/dev/null
wait "$CAPS_JOB" 2>/dev/null
print_log caps-owner | tail -n 3
caps_cleanup
