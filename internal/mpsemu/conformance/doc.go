// Package conformance checks the MPS emulator against NVIDIA's real
// nvidia-cuda-mps-control. Each scenario is a script of steps (start a
// daemon, send commands, kill processes, wait for log lines) that runs once
// against a real daemon of one driver generation and once against the
// emulator in that generation's mode (MPSEMU_DRIVER). The transcripts
// (stdout, stderr and exit status of every call, pipe-directory listings
// with modes, the pid file, control.log and server.log, with pids,
// timestamps and the scenario directory normalised) must be identical; any
// difference fails the test. `make conformance` prints the table.
//
// Both daemons spawn the emulator's server in standalone mode
// (MPSEMU_SERVER_STANDALONE=1): it never registers with a daemon, which is
// exactly what NVIDIA's daemon sees of any server on a machine without a GPU.
// So the emulated daemon is compared on everything a GPU-less real daemon
// can show, with no exceptions.
//
// What a GPU-less real daemon cannot show, and so is not compared here: a
// server becoming ACTIVE or FAULT and the commands whose answers depend on
// it (get_server_status of a ready server, per-server thread percentage and
// pinned memory, get_client_list, terminate_client), CUDA clients, the log
// lines a ready server and its clients produce (NEW SERVER ... Ready, NEW
// CLIENT ...), an idle ready server obeying quit or shutdown_server without
// -f, and everything in server.log a real server writes. The emulator's tests
// cover those against MPS's documentation and what hack/gpu-mps-probe.sh
// recorded on a real H200 (docs/gpu-probe/).
//
// Steps run as root or, with Step.As, as one of three test users the test
// makes (uids 64800-64802): the daemon's owner (a daemon started as it
// owns the scenario directory), a member of the owner's group, a stranger.
// The programs are then run from copies the users may execute. So who may
// change defaults, quit, or address a server is compared too, wherever a
// GPU-less daemon decides it: for a pid that is no server every caller
// gets "Server N not found" before any check of who asks, so the rules for
// a real server's owner are left to hack/gpu-check.sh (docs/emulator.md).
//
// A step may also write raw bytes into the pipe directory's log FIFO, as
// any process that may open it can (the log-fifo-* scenarios: a header
// declaring 4 GiB of text, one that overruns the logger, a bad header, a
// full FIFO). From then on the log is compared as it stands once it stops
// growing, since the daemon's logger may swallow or drop every later line.
//
// A scenario whose transcripts differ is run again; only a difference that
// repeats fails. One that does not is logged and marked identical* in the
// table: NVIDIA's daemon has rare races (a second command to a quitting
// daemon, log lines lost at exit) that no normalisation removes.
//
// Two races of NVIDIA's daemon are normalised, on both sides alike: lines
// of different processes interleave by scheduling (each process's own order
// is kept), and "UI closed" may be logged before or after the server-exit
// lines a command caused (it is moved above them).
package conformance
