// Package mps drives and watches one NVIDIA MPS control daemon
// (nvidia-cuda-mps-control): start, adopt, typed commands with deadlines,
// stop with escalation, health probes and an event stream of daemon and
// server lifecycle. It is the only package of the daemon that runs the MPS
// binaries, and it drives the real ones and the emulator identically.
//
// What it owns:
//   - Start (`-d` with a full environment, CUDA_VISIBLE_DEVICES, optional
//     -multiuser-server, defaults applied in whole MiB) and Adopt of a running
//     daemon after mpsd restarts. Stale pipe-directory files are removed only
//     when no verified daemon holds the POSIX lock on control_lock.
//   - Every control command as a typed method. Commands always go on stdin
//     (555 rejects them as arguments); output is parsed, never the exit code
//     alone; failures are *CommandError values wrapping the package's
//     sentinels. A call's ctx ending kills the client process, so a hung
//     daemon never blocks a caller past its deadline (ErrTimeout).
//   - Driver generations, detected at run time, never assumed: without
//     get_server_status (535) server state is inferred from get_server_list
//     and "NEW SERVER <pid>: Ready".
//   - Trust: the pipe directory's log FIFO (0777) and pid file (0666) are
//     anyone's to write, and the daemon copies every FIFO record into
//     control.log or server.log with the kind and pid the writer chose. So
//     the daemon is the holder of the POSIX lock on control_lock (every
//     generation takes it), verified through a pidfd: it runs the
//     configured control program, as root (or this process's uid), alive;
//     its identity (pid and start time) is Daemon.Identity, and
//     Config.Expect makes Adopt and Reclaim take that process only
//     (ErrUnverifiedDaemon). The pid file and control.log never pick a pid.
//     A server is registered, reported and ever signalled only once
//     verified through a pidfd opened before /proc is read: a child of the
//     daemon, running nvidia-cuda-mps-server, started after the daemon. A
//     server's exit comes from its pidfd only. A record naming any other
//     pid is dropped and reported as UnverifiedRecord; faults carry
//     KnownServer and remain claims to confirm.
//   - Local exhaustion: when this process cannot start the control client
//     or open a pidfd or eventfd for want of descriptors, processes or
//     memory (EMFILE, ENFILE, EAGAIN, ENOMEM), the error wraps
//     ErrLocalResources, never ErrTimeout, ErrNoDaemon or
//     ErrDaemonQuitting: it says nothing about the daemon's health.
//   - Events: a pidfd per daemon and verified server (exit seen at once,
//     wait status read from the zombie when possible) plus a control.log
//     follower on fsnotify that survives truncation and rename rotation,
//     whose lines only point at processes to verify. Each exit is reported
//     once, from the pidfd. A server.log follower
//     reports the fatal GPU faults a server survives (ServerFault), whose
//     clients all got a sticky error, and the client each names just
//     before (FaultCulprit: a hint, the pid a client told its server).
//   - Stop: `quit -t N`, then SIGKILL of servers that ignore SIGINT, then of
//     the daemon and its orphans, all through pidfds of verified processes
//     (no recycled pid, no process a record merely names, is ever
//     signalled), bounded in time, with a report of what was killed.
//
// What it never does: decide policy (which uid, how many clients, when to
// restart: the caller, mpsd's watchdog, does), touch cgroups or NVML, use
// MPS's default directories, or stop a daemon on Close (a restarted mpsd
// adopts it).
//
// Known behaviour of NVIDIA's daemon the callers must live with: a command
// sent while it is busy (reaping a server) is occasionally accepted and
// dropped, with the client exiting 0 and printing nothing, and under churn
// it may answer "Cannot send command to MPS control daemon process"
// (ErrDaemonQuitting) without quitting. Commands that print nothing on
// success (start_server, shutdown_server, the set_* of memory limits)
// therefore cannot be confirmed from their output; confirm through events
// or a get_* command when it matters.
package mps
