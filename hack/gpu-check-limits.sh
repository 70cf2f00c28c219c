# shellcheck shell=bash
# hack/gpu-check-limits.sh: step 8 of hack/gpu-check.sh, sourced by it (it
# uses its helpers, $CLIENT, $D, $BASE, $DRY, $METRICS and the running
# mpsd). Limits as NVML and mpsd see and enforce them, on the group delta
# of gpu-check.sh's config (memory_grace LIM_GRACE_S, 2 s; reconcile:
# terminate; max_mem 8G, its servers' pinned cap), whose clients run as
# LIM_UID (not root: mpsd never ends root's processes):
#   a. NVML's view of MPS clients: a lease (--mem 2G) whose client allocates
#      and holds 1 GiB; mpsd's mem_used_bytes for it (mpsctl status --json)
#      must be at least what the client got and at most that plus
#      GPU_CHECK_MEM_OVERHEAD_MIB (default 1024: NVML may count some of the
#      client's context too; the pinned limit counted 271 MiB of it on the
#      H200, docs/gpu-probe; the difference seen is RECORDed); whether
#      nvidia-smi --query-compute-apps lists the client's pid or only the
#      server's is RECORDed;
#   b. the invalid-entry escape blocked: a command under `mps-launch --mem
#      2G` that sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT itself to
#      0=2048M,9=2048M (device 9 it cannot see: MPS drops every pinned limit
#      of the client, internal/mpsenv) and allocates and holds 3 GiB. PASS
#      if MPS refuses the allocation past --mem, or if mpsd revokes the
#      lease with "memory limit exceeded" (mps-launch exits 125,
#      docs/architecture.md) within memory_grace + 3 probe intervals + 5 s
#      of the allocation; FAIL if it holds more than --mem past that. What a
#      raw client (no mps-launch) of alpha's server gets with 0=2048M and
#      with 0=2048M,9=2048M is RECORDed: the hazard on this driver;
#   c. an unleased client detected and ended: a client started directly on
#      delta's pipe directory, beside a leased bystander of the same uid and
#      server, must be logged ("GPU process not accounted to a lease of its
#      instance", kind=unleased, action=terminated), counted
#      (mpsd_unreconciled_clients_total and
#      mpsd_unreconciled_clients_terminated_total, {group="delta",
#      kind="unleased"}, each one more than before) and ended, while the
#      bystander runs on with the same pid.
# Client priority is step 7b (hack/gpu-check-mps.sh). The clients and
# launchers of this step are stopped before it ends; limits_cleanup, called
# from gpu-check.sh's cleanup, ends the unleased client should the run stop
# first (the launchers are in LAUNCHERS).

LIM_PROBE=2 # watchdog.probe_interval (the default: the config leaves it)
LIM_MARGIN=$((3 * LIM_PROBE + 5))
LIM_OVERHEAD_MIB=${GPU_CHECK_MEM_OVERHEAD_MIB:-1024}
LIM_UNLEASED=''
# LIM_AS: the command prefix that runs a program as LIM_UID (and gid
# LIM_UID, no other groups); empty when that is this script's uid.
LIM_AS=()
if ((LIM_UID != UID_NOW)); then
	if command -v setpriv >/dev/null 2>&1; then
		LIM_AS=(setpriv --reuid="$LIM_UID" --regid="$LIM_UID" --clear-groups)
	else
		LIM_AS=(python3 -c 'import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setgid(u); os.setuid(u); os.execvp(sys.argv[2], sys.argv[2:])' "$LIM_UID")
	fi
fi

limits_cleanup() {
	local p=$LIM_UNLEASED
	LIM_UNLEASED=''
	[[ -n $p && -e /proc/$p && $(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) == "$$" ]] || return 0
	kill -KILL "$p" 2>/dev/null && say "killed step 8's unleased client $p"
	wait "$p" 2>/dev/null
}

# lim_launch NAME SM MEM PROGRAM ARGS...: mps-launch in delta as LIM_UID,
# in the background (setpriv and python3 exec it: LPID[NAME] is the
# launcher's pid); its output and the client's in clients/NAME.log.
lim_launch() {
	local name=$1 sm=$2 mem=$3
	shift 3
	show "mps-launch --group delta --sm $sm --mem $mem --no-requeue --wait 60s -- $(basename "$1") ${*:2} &   # $name, uid $LIM_UID"
	"${LIM_AS[@]}" "$BIN/mps-launch" --group delta --sm "$sm" --mem "$mem" --no-requeue --wait 60s -- "$@" \
		</dev/null >"$D/clients/$name.log" 2>&1 &
	# shellcheck disable=SC2004 # LPID is associative (gpu-check.sh)
	LPID[$name]=$!
	LAUNCHERS+=($!)
}
# lim_stop NAME: stop NAME's launcher (it forwards TERM to its client) if it
# still runs; its exit status in RC[NAME].
lim_stop() {
	local rc=0
	stop_pid "${LPID[$1]}" "$BIN/mps-launch"
	wait "${LPID[$1]}" 2>/dev/null || rc=$?
	RC[$1]=$rc
}
# lim_pid NAME: the client's pid, from its "client[PID] start" line.
lim_pid() { grep -m1 -o 'client\[[0-9]*\] start' "$D/clients/$1.log" 2>/dev/null | tr -dc '0-9'; }
# lim_gone PID: the process has exited (a zombie counts: it is our child).
lim_gone() { [[ ! -e /proc/$1 || $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == Z ]]; }
lim_running() { kill -0 "${LPID[$1]}" 2>/dev/null; }
# lim_before T: now is before T (seconds since the epoch).
lim_before() { awk -v t="$1" -v n="$(now)" 'BEGIN { exit !(n < t) }'; }

# lim_used PID: mpsd's mem_used_bytes for the running lease of delta whose
# processes include PID; "-" while it has none, nothing when no such
# lease runs. The table has no such column: "-".
lim_used() {
	case $PARSER in
	python3)
		"$BIN/mpsctl" status --json 2>/dev/null | python3 -c '
import json, sys
for l in json.load(sys.stdin)["leases"]:
    if l["group"] == "delta" and l["state"] == "running" and int(sys.argv[1]) in (l.get("pids") or []):
        u = l.get("mem_used_bytes")
        print("-" if u is None else u)
' "$1"
		;;
	jq)
		"$BIN/mpsctl" status --json 2>/dev/null | jq -r --argjson p "$1" \
			'.leases[] | select(.group == "delta" and .state == "running" and ((.pids // []) | index($p))) | .mem_used_bytes // "-" | tostring'
		;;
	*)
		[[ " $(st_pids delta) " == *" $1 "* ]] && echo -
		;;
	esac
}
# lim_wait_used PID BYTES SECONDS: poll lim_used until it is at least
# BYTES, for up to SECONDS; LIM_USED is the last reading.
lim_wait_used() {
	local until=$((SECONDS + $3))
	while :; do
		LIM_USED=$(lim_used "$1")
		[[ $LIM_USED =~ ^[0-9]+$ ]] && ((LIM_USED >= $2)) && return 0
		((SECONDS < until)) || return 1
		need_mpsd
		sleep 0.2
	done
}
# lim_metric NAME KIND: the value of NAME{group="delta",kind="KIND"}; 0
# when absent.
lim_metric() {
	http_get /metrics 2>/dev/null | awk -v n="$1" -v k="kind=\"$2\"" '
index($1, n "{") == 1 && index($1, "group=\"delta\"") && index($1, k) { v = $NF } END { print v + 0 }'
}
lim_mib() { awk -v b="$1" 'BEGIN { printf "%d", b / 1048576 }'; }

heading "8. Limits as NVML and mpsd see them: memory per lease, the invalid-entry escape, an unleased client"
need_mpsd
lim_ready() { [[ $(st_inst delta state 2>/dev/null) == ready ]]; }
if ! wait_until 30 "delta's instance" lim_ready; then
	fail "delta's instance is not ready (state '$(st_inst delta state)'): step 8 not run"
	return 0
fi
say "group delta: memory_grace ${LIM_GRACE_S}s, reconcile: terminate, max_mem 8G; its clients run as uid $LIM_UID"
if [[ $PARSER == table ]]; then
	note "status is read from the table, which shows no lease's memory in use: (a) and the readings in (b) are not judged (python3 or jq needed)"
fi

# a. What NVML reports for an MPS client, as mpsd reads it.
lim_launch lim-nvml 10 2G "$CLIENT" --alloc 1 --hold --duration 60
wait_until 60 "lim-nvml's allocation" has lim-nvml ' alloc \| error ' || true
need_mpsd
LIM_CPID=$(lim_pid lim-nvml)
LIM_GOT=$(field lim-nvml got_mib ' alloc ')
if [[ -z $LIM_CPID || ! $LIM_GOT =~ ^[0-9]+$ ]] || ! lim_running lim-nvml; then
	print_log lim-nvml
	fail "lim-nvml: the client did not allocate and hold memory under its lease"
else
	used_mib=''
	if [[ $PARSER != table ]]; then
		t=$(now)
		lim_wait_used "$LIM_CPID" $((LIM_GOT << 20)) $((3 * LIM_PROBE + 4))
		say "  mpsd's mem_used_bytes for the lease of pid $LIM_CPID: ${LIM_USED:-no running lease} ($(dt "$t") s after the client's allocation line was seen)"
	fi
	print_log lim-nvml
	if [[ $PARSER == table ]]; then
		: # not judged (the note above)
	elif [[ $LIM_USED =~ ^[0-9]+$ && $LIM_USED != 0 ]]; then
		used_mib=$(lim_mib "$LIM_USED")
		if ((LIM_USED >= LIM_GOT << 20 && LIM_USED <= (LIM_GOT + LIM_OVERHEAD_MIB) << 20)); then
			pass "a lease whose client holds $LIM_GOT MiB: mpsd reads $used_mib MiB for it (NVML through mpsd; at most $LIM_OVERHEAD_MIB MiB over)"
		else
			fail "a lease whose client holds $LIM_GOT MiB: mpsd reads $used_mib MiB ($LIM_USED bytes; expected $LIM_GOT to $((LIM_GOT + LIM_OVERHEAD_MIB)) MiB)"
		fi
		note "RECORD: mpsd's figure for the lease is $((used_mib - LIM_GOT)) MiB over what its client allocated"
	elif [[ $LIM_USED == 0 ]]; then
		fail "a lease whose client holds $LIM_GOT MiB: mpsd reads 0 bytes for it: NVML attributes none of it to the lease's processes"
	else
		fail "a lease whose client holds $LIM_GOT MiB: mpsd has no memory reading for it ('${LIM_USED}')"
	fi
	if [[ $DRY == 1 ]]; then
		note "RECORD (dry run): no nvidia-smi; the simulated NVML lists each emulated client with what it allocated (docs/emulator.md)"
	else
		show "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
		smi=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1)
		printf '%s\n' "$smi" | sed 's/^/  /'
		servers=" $(st_inst delta server_pids) "
		smi_client='' smi_servers='' smi_others=''
		while IFS=, read -r p name used; do
			p=${p// /}
			[[ $p =~ ^[0-9]+$ ]] || continue
			used=${used# }
			if [[ $p == "$LIM_CPID" ]]; then
				smi_client=$used
			elif [[ $servers == *" $p "* ]]; then
				smi_servers+=" $p (delta's server, $used)"
			elif [[ -e /proc/$p ]]; then
				smi_others+=" $p ($(cat "/proc/$p/comm" 2>/dev/null),${name}, $used)"
			else
				smi_others+=" $p (${name# }, $used; no such pid in this pid namespace)"
			fi
		done <<<"$smi"
		if [[ -n $smi_client ]]; then
			note "RECORD: nvidia-smi lists the MPS client's own pid $LIM_CPID ($smi_client; mpsd, from NVML's two lists: ${used_mib:-?} MiB)${smi_servers:+, and$smi_servers}"
		elif [[ -n $smi_servers ]]; then
			note "RECORD: nvidia-smi lists only the server:$smi_servers, not the client pid $LIM_CPID (mpsd, from NVML's two lists: ${used_mib:-no} MiB for it)"
		else
			note "RECORD: nvidia-smi lists neither the client pid $LIM_CPID nor delta's server (mpsd, from NVML's two lists: ${used_mib:-no} MiB for it)"
		fi
		[[ -n $smi_others ]] && note "RECORD: nvidia-smi also lists:$smi_others"
	fi
fi
lim_stop lim-nvml

# b. The invalid-entry escape: the command sets the variable itself.
LIM_BAD=0=2048M,9=2048M
t=$(now)
lim_launch lim-escape 10 2G env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$LIM_BAD "$CLIENT" --alloc 3 --hold --duration 60
wait_until 60 "lim-escape's allocation" eval 'has lim-escape " alloc " || ! lim_running lim-escape' || true
need_mpsd
got=$(field lim-escape got_mib ' alloc ')
t_alloc=$(field lim-escape t ' alloc ')
if [[ ! $got =~ ^[0-9]+$ || -z $t_alloc ]]; then
	lim_stop lim-escape
	print_log lim-escape
	fail "lim-escape: the client did not get to allocate (exit status ${RC[lim-escape]})"
elif ((got <= 2048)); then
	lim_stop lim-escape
	print_log lim-escape
	pass "the invalid entry $LIM_BAD did not lift --mem 2G: MPS refused the allocation at $got MiB of 3072 (error $(field lim-escape error ' alloc '))"
else
	# Over --mem: mpsd's memory enforcement must revoke the lease.
	deadline=$(awk -v t="$t_alloc" -v g="$LIM_GRACE_S" -v m="$LIM_MARGIN" 'BEGIN { printf "%.3f", t + g + m }')
	used=''
	while lim_running lim-escape && lim_before "$deadline"; do
		[[ $PARSER != table && -n $(lim_pid lim-escape) ]] && used=$(lim_used "$(lim_pid lim-escape)")
		need_mpsd
		sleep 0.2
	done
	if lim_running lim-escape; then
		[[ $PARSER != table ]] && used=$(lim_used "$(lim_pid lim-escape)")
		lim_stop lim-escape
		print_log lim-escape
		fail "the invalid entry $LIM_BAD lifted --mem 2G: the client held $got MiB (mpsd read ${used:-nothing}) for $(dt "$t_alloc") s, past memory_grace ${LIM_GRACE_S}s + ${LIM_MARGIN}s, and the lease was not revoked"
	else
		lim_stop lim-escape
		t_end=$(now)
		print_log lim-escape
		say "  [lim-escape] exit status ${RC[lim-escape]}"
		if ((RC[lim-escape] == 125)) && has lim-escape 'memory limit exceeded'; then
			pass "the invalid entry $LIM_BAD let the client take $got MiB past --mem 2G, and mpsd revoked the lease ('memory limit exceeded', mps-launch exit 125) $(dt "$t_alloc" "$t_end") s after the allocation (memory_grace ${LIM_GRACE_S}s)"
			timing "lim-escape: alloc past --mem -> exit 125 (polled)" "$(dt "$t_alloc" "$t_end")"
		else
			fail "the invalid entry $LIM_BAD let the client take $got MiB past --mem 2G; its launcher exited ${RC[lim-escape]} without the revocation 'memory limit exceeded' (exit 125)"
		fi
	fi
	grep -E 'lease over its memory limit|lease revoked: memory limit exceeded' "$D/mpsd.log" | grep 'lease=delta-' |
		sed -E 's/ gpu=GPU-[0-9a-f-]+//; s/^/  mpsd.log: /' | head -n 4
fi
timing "lim-escape: launch to end" "$(dt "$t")"

# b (cont). A raw client of alpha's server (its cap: 8G), no mps-launch:
# what the invalid entry does on this driver. (alpha reconciles with
# report: the client is only reported.)
A_PIPE=$(find "$BASE/run/alpha" -type d -name pipe 2>/dev/null | head -n 1)
raw=()
for ent in 0=2048M "$LIM_BAD"; do
	n=lim-raw-${#raw[@]}
	show "CUDA_MPS_PIPE_DIRECTORY=<alpha's pipe> CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$ent gpu_check_client --alloc 3   # $n, no mps-launch"
	CUDA_MPS_PIPE_DIRECTORY=$A_PIPE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$ent timeout -k 5 60 "$CLIENT" --alloc 3 \
		</dev/null >"$D/clients/$n.log" 2>&1
	print_log "$n"
	raw+=("$(field "$n" got_mib ' alloc ')")
done
if [[ ${raw[0]} =~ ^[0-9]+$ && ${raw[1]} =~ ^[0-9]+$ ]]; then
	if ((raw[1] > 2048 && raw[0] <= 2048)); then
		how="the invalid entry dropped the client's limit (the hazard, seen here)"
	elif ((raw[1] <= 2048)); then
		how="the invalid entry did not drop it"
	else
		how="neither held it to 2048M"
	fi
	note "RECORD: a raw client of alpha's server (cap 8G) got ${raw[0]} MiB of 3072 with 0=2048M and ${raw[1]} MiB with $LIM_BAD: $how$([[ $DRY == 1 ]] && echo ' (dry run: the emulator'"'"'s model)')"
else
	note "RECORD: a raw client of alpha's server did not allocate (0=2048M: ${raw[0]:-nothing}, $LIM_BAD: ${raw[1]:-nothing})"
fi

# c. An unleased client beside a leased bystander.
need_mpsd
lim_launch lim-bystander 10 1G "$CLIENT" --duration 60
by_ready() { has lim-bystander ' ready ' && [[ -n $(st_pids delta) ]]; }
wait_until 60 "lim-bystander" by_ready || true
BY_PIDS=$(st_pids delta)
D_PIPE=$(find "$BASE/run/delta" -type d -name pipe 2>/dev/null | head -n 1)
if ! by_ready || [[ -z $D_PIPE ]]; then
	print_log lim-bystander
	fail "lim-bystander did not start in delta (pipe ${D_PIPE:-not found}): the unleased client is not tried"
else
	n_found=$(lim_metric mpsd_unreconciled_clients_total unleased)
	n_ended=$(lim_metric mpsd_unreconciled_clients_terminated_total unleased)
	show "CUDA_MPS_PIPE_DIRECTORY=<delta's pipe> gpu_check_client --duration 60 &   # lim-unleased, uid $LIM_UID, no mps-launch"
	t=$(now)
	"${LIM_AS[@]}" env CUDA_MPS_PIPE_DIRECTORY="$D_PIPE" "$CLIENT" --duration 60 </dev/null >"$D/clients/lim-unleased.log" 2>&1 &
	LIM_UNLEASED=$!
	until=$((SECONDS + 3 * LIM_PROBE + 6))
	while ! lim_gone "$LIM_UNLEASED" && ((SECONDS < until)); do
		need_mpsd
		sleep 0.1
	done
	if lim_gone "$LIM_UNLEASED"; then
		t_end=$(now)
		rc=0
		wait "$LIM_UNLEASED" || rc=$?
		p=$LIM_UNLEASED
		LIM_UNLEASED=''
		print_log lim-unleased
		say "  [lim-unleased] exit status $rc, $(dt "$t" "$t_end") s after it started"
		timing "unleased client started -> gone" "$(dt "$t" "$t_end")"
		ended=1
	else
		p=$LIM_UNLEASED
		limits_cleanup
		print_log lim-unleased
		ended=0
	fi
	line=$(grep 'msg="GPU process not accounted to a lease of its instance"' "$D/mpsd.log" | grep 'kind=unleased group=delta' | grep -E " pid=$p( |$)" | head -n 1)
	[[ -n $line ]] && say "  mpsd.log: $(sed -E 's/ gpu=GPU-[0-9a-f-]+//' <<<"$line")"
	n_found2=$(lim_metric mpsd_unreconciled_clients_total unleased)
	n_ended2=$(lim_metric mpsd_unreconciled_clients_terminated_total unleased)
	say "  mpsd_unreconciled_clients_total{group=\"delta\",kind=\"unleased\"} $n_found -> $n_found2; mpsd_unreconciled_clients_terminated_total $n_ended -> $n_ended2"
	if [[ -n $line ]] && ((n_found2 > n_found)); then
		pass "the unleased client $p (uid $LIM_UID) on delta's server was reported: the log line (kind=unleased) and mpsd_unreconciled_clients_total"
	else
		fail "the unleased client $p on delta's server was not reported (log line: ${line:+yes}${line:-none}, metric $n_found -> $n_found2)"
	fi
	if ((ended)) && [[ $line == *action=terminated* ]] && ((n_ended2 > n_ended)); then
		pass "the unleased client was ended under reconcile: terminate (exit status $rc; mpsd_unreconciled_clients_terminated_total counts it)"
	else
		fail "the unleased client was not ended within $((3 * LIM_PROBE + 6)) s under reconcile: terminate (gone: $ended, action terminated: $([[ $line == *action=terminated* ]] && echo yes || echo no), metric $n_ended -> $n_ended2)"
	fi
	# The bystander, after a probe more.
	sleep $((LIM_PROBE + 1))
	BY_NOW=$(st_pids delta)
	BY_ALIVE=1
	for q in $BY_PIDS; do
		lim_gone "$q" && BY_ALIVE=0
	done
	if [[ -n $BY_PIDS && $BY_NOW == "$BY_PIDS" && $BY_ALIVE == 1 ]] && lim_running lim-bystander &&
		! has lim-bystander 'revoked\| error '; then
		pass "delta's leased bystander runs on with the same pid ($BY_PIDS, mpsctl status; server $(st_inst delta server_pids)), untouched"
	else
		fail "delta's bystander: lease pids '$BY_PIDS' before, '$BY_NOW' after (alive: $BY_ALIVE)$(has lim-bystander 'revoked' && echo ', revoked')"
	fi
fi
lim_stop lim-bystander
print_log lim-bystander | tail -n 3
say "  [lim-bystander] stopped by the script: exit status ${RC[lim-bystander]}"
