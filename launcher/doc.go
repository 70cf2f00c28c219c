// Package launcher is the library behind mps-launch: flag and size parsing,
// the lease stream to mpsd over its unix socket (package api's protocol,
// through package client), running the user's command with the MPS
// environment of a granted lease, and the requeue loop that relaunches the
// command when mpsd requeues the lease. cmd/mps-launch only calls Main.
//
// A run is a session whose decisions are one pure function, step
// (session.go): from its state (a phase: queued, launching, running,
// revoked, verdictPending, detached, done; the lease; a pending verdict)
// and an input (an event, the stream's loss, the command's exit, a
// signal, the verdict's due time, the answer to a release a verdict
// asked for) to the next state and the actions that
// carry it out. run.go's loop applies them; stream.go owns the stream and
// its reconnection (conn), children.go the command's processes
// (children) and the attach that releases them.
//
// What it owns:
//   - the command line of docs/architecture.md#mps-launchs-command-line-and-exit-statuses (ParseArgs, one line per bad input)
//     and the exit statuses: the command's own, 128+N for signal N, 125,
//     126, 127 and 75 (ExitCode maps errors to them);
//   - the defaults a Slurm job's environment gives (job id, gres/mps SM
//     share, the job's GPUs; see Usage) and the refusal to run as another
//     uid than the job's (Options.CheckUID). examples/slurm/ has the
//     slurm.conf side, RequeueExit=75 among it;
//   - one lease stream per run, held open exactly as long as the lease is
//     needed (closing it releases the lease), re-opened with the lease id
//     when mpsd restarts: the granted lease's, or the queued one's, which
//     so keeps its place in the queue;
//   - outliving mpsd restarts: a refused connection, a reset or EOF
//     before mpsd's answer, a stream that ends before its first event and
//     an attach that cannot reach mpsd all mean mpsd is away; requests are
//     retried with backoff until it is back or the outage has lasted
//     Config.ReconnectTimeout (a minute), a command granted just before
//     mpsd went waits unstarted for its attach meanwhile, and giving up
//     exits 75 (ErrLost) with a line saying for how long mpsd was
//     unreachable. A command that ends meanwhile has its status reported
//     once its lease is resumed and closed (freeing its share in the new
//     mpsd at once) or the window is over. Before mpsd first answered, a
//     socket with nothing listening (none there, or one that refuses)
//     fails at once (125) unless its live marker (api.LiveMarker: mpsd
//     makes it when it serves, keeps it across SIGTERM and crashes, and
//     mpsctl shutdown removes it with the socket) says an mpsd is
//     coming back: no mpsd, one shut down, or another socket meant;
//   - the trampoline (trampoline.go): the command's process starts as a
//     copy of this binary that waits on a pipe until mpsd has attached it
//     to the lease's cgroup, then execs the program, so the program never
//     runs outside the cgroup while mps-launch itself stays outside. Main
//     serves trampoline mode when MPSD_LAUNCH_TRAMPOLINE is set in the
//     environment it is given. mps-launch is built without cgo (make
//     build): a static binary reaches main about 1 ms sooner than one
//     linked with libc, and that start is on every launch's critical
//     path;
//   - signal forwarding (SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1,
//     SIGUSR2 go to the command; with no command, the first four abandon
//     the request; SIGHUP or SIGINT ignored when mps-launch started, as
//     under nohup, stay ignored and are not passed on) and the queue
//     status: a live line on a terminal, else (a batch job's log) a line
//     as a wait begins, at each change of mpsd's reason and at the grant;
//   - the version skew warning (skew.go): one line, once, when mpsd serves
//     a lower API level than the session needs (requestLevel).
//
// It never touches MPS, cgroups or the GPU (mpsd does, as root), never
// kills a command mpsd revoked (MPS wants terminate_client first; mpsd
// kills the cgroup), never copies the command's stdin, stdout or stderr
// (the command inherits the descriptors: 0, 1, 2 and every one the caller
// passed down, at its own number, and no others), and never logs: what it says is
// a line on stderr for the person who ran it.
package launcher
