// Package mpsemu is the MPS emulator: stand-ins for nvidia-cuda-mps-control,
// nvidia-cuda-mps-server and a CUDA client (mpsemu-client) that behave like
// NVIDIA's MPS closely enough that the daemon's tests mean something. They
// drop in through PATH or configuration; no code path of mpsd knows it is
// talking to them. `go build -o bin/emu/ ./internal/mpsemu/cmd/...` builds
// the three programs under their real names.
//
// The control daemon copies NVIDIA's binaries of driver 535, 550 and 555
// byte for byte where a GPU-less machine can observe them (outputs, error
// strings, exit codes, pipe-directory files and modes, control.log lines);
// the server and client emulate what needs a GPU. Packages:
//
//	control   nvidia-cuda-mps-control: daemon and client mode
//	server    nvidia-cuda-mps-server: states, admission, limits, faults
//	client    mpsemu-client: the stand-in CUDA application (exit codes there)
//	ctlwire   NVIDIA's control-socket protocol
//	emuwire   the emulator's private protocol (abstract unix sockets)
//	mpslog    MPS log lines and log-FIFO records
//	cstr      C-library scanning (sscanf, strtod, strtoull) and MPS sizes
//
// # Environment
//
// NVIDIA's variables mean what they mean for MPS: CUDA_MPS_PIPE_DIRECTORY
// (default /tmp/nvidia-mps), CUDA_MPS_LOG_DIRECTORY (default
// /var/log/nvidia-mps), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_CLIENT_PRIORITY (on the daemon: defaults; on a client: can only
// lower), CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=8G,1=512M", ordinals or
// UUIDs of the devices the client sees, per client, can only lower; one
// entry naming a device the client does not see drops every entry, as
// NVIDIA documents), CUDA_VISIBLE_DEVICES (the daemon's GPUs, inherited by
// the server; unset means one GPU, UUIDs or indexes otherwise; on a
// client, which of its server's devices it sees). The emulator's own knobs:
//
//	MPSEMU_DRIVER=535|550|555|580  generation the control program imitates (default:
//	                               MPSEMU_DRIVER_VERSION's, else 550)
//	MPSEMU_DRIVER_VERSION=V        the driver the (simulated) GPUs report, e.g.
//	                               570.172.08: without MPSEMU_DRIVER, the control
//	                               program imitates the newest generation not newer
//	                               than V (555 to 579: 555; 580 and later: 580, with
//	                               the H200's version lines). mpsd --simulate sets
//	                               it from simulate.model
//	MPSEMU_DEVICE_MEMORY=SIZE      memory of each emulated GPU (default 40G)
//	MPSEMU_MAX_CLIENTS=N           clients per server, 1..48 (default 48, MPS's limit)
//	MPSEMU_SERVER_IGNORE_SIGINT=1  the server ignores SIGINT (a server stuck in the GPU)
//	MPSEMU_SERVER_STANDALONE=1     the server does not register with the emulated
//	                               daemon, which then sees it as NVIDIA's daemon sees a
//	                               stand-in: INITIALIZING for ever; it also writes no
//	                               server.log lines (for conformance runs)
//	MPSEMU_SERVER_FAIL_INIT=DURATION  the server exits 1 after DURATION without serving,
//	                               like one whose GPU initialisation fails (a crash loop
//	                               while clients wait)
//	MPSEMU_FAULT_RESET=DURATION    how long a server stays FAULT after the last client
//	                               a fault affected has gone, the device reset a real
//	                               server does (default 0: at once). An emulator
//	                               choice, not measured precisely on a GPU (an H200's
//	                               FAULT window was shorter than a 100 ms poll, see
//	                               docs/gpu-probe; hack/gpu-check.sh measures it)
//	MPSEMU_XID_SOCKET=PATH         on the daemon: where it reports its clients'
//	                               faults as Xid 31 ("<GPU UUID> 31\n"), as the
//	                               driver reports them to NVML (mpsd --simulate sets it)
//
// Two more are internal and never need setting: MPSEMU_DAEMON_CHILD marks
// the re-executed daemon, MPSEMU_EXEC_FAILED the child that stands for a
// server binary missing from PATH.
//
// # Where the emulator knowingly differs
//
// Only a GPU shows these, so NVIDIA's GPU-less daemon cannot confirm them:
// the emulated server registers with the emulated daemon, which then logs
// "Accepting connection..." and "NEW SERVER <pid>: Ready" and reports it
// ACTIVE or FAULT; emulated clients produce "NEW CLIENT <pid> from user
// <uid>: ..." lines; quit and shutdown_server without -f make an idle
// emulated server exit, where NVIDIA's daemon with a stand-in waits for
// ever; the server.log lines of the emulated server, the output of
// get_client_list, get_device_client_list, terminate_client and the
// per-server commands on a ready server follow MPS's documentation and the
// daemon's strings. Where a real GPU was observed (driver 580 on an H200,
// docs/gpu-probe), the emulator follows that observation: a client's
// connection without credentials and its two "NEW CLIENT" lines (the first
// "Server is not ready, push client to pending list" when it must wait),
// "Try shutting down server <pid>, backoff is disabled" for shutdown_server
// of a ready server, the server.log lines of start-up, clients, faults and
// shutdown (with "MPS Emulated GPU" for the card's name), and CUDA errors 2,
// 700 and 806. The 580 daemon's extra lines ("CUDA MPS Control binary
// version", the pinned-memory echo) and the server's binary and driver
// version lines belong to a generation the emulator does not emulate and
// are not written. Races of NVIDIA's daemon (whether
// the forked server's "Starting new server" line lands before or after the
// caller's "UI closed", and which status a quit caller gets while the
// daemon exits) are resolved the way they were observed most often.
//
// The log FIFO is NVIDIA's, hostile writers included (docs/emulator.md,
// "The log FIFO"): a forged header declaring 4 GiB of text silences the
// daemon's logs for good and makes it ignore quit (it never exits and
// keeps control_lock) until about 6 KiB more text kills it; a bad header
// stops the logger, and the FIFO then filling up hangs the daemon. Only a
// header declaring 2^38 bytes or more differs: NVIDIA's logger then waits
// or stops at random, the emulator's always waits.
package mpsemu
