// Package api holds the wire types shared by mpsd, mps-launch and mpsctl:
// the lease request, the NDJSON lease events, the attach request, the error
// document and the status document, with the strict decoders and the
// validation both sides of the socket apply. It owns the protocol, so every
// side agrees on one definition; it does no I/O of its own beyond the
// readers and writers it is handed, never logs and holds no state.
//
// # Protocol, version 1
//
// HTTP/1.1 with JSON bodies over mpsd's unix socket (DefaultSocket, or
// $MPSD_SOCKET, or mps-launch --socket). mpsd identifies the caller by the
// socket's peer credentials (SO_PEERCRED), never by anything in a request.
// Every path is under /v1; a later incompatible protocol gets /v2 and
// mpsd serves both for a while. Within v1, new optional fields may be added:
// readers of events and responses ignore fields they do not know, while
// mpsd rejects unknown fields in requests (a typo must not silently become
// a default).
//
// POST /v1/leases (PathLeases), body LeaseRequest, at most
// MaxRequestBytes. If mpsd refuses before queueing (malformed body, unknown
// field, out-of-range value, over-size body) it answers a 4xx or 5xx status
// with an Error body. Otherwise it answers 200 with Content-Type
// application/x-ndjson at once, before queueing (clients time out waiting
// for the headers), with the lease's id in the Mpsd-Lease-Id header
// (HeaderLeaseID: a client whose stream ends before its first event
// resumes that lease), and streams Events, one JSON object per line, each
// flushed as it is written; blank lines are keep-alives and are skipped.
// The events of one connection follow this grammar:
//
//	queued*  ( granted ( revoked requeued queued* granted )* )?  error?
//
// An error event is always the last line; mpsd closes the stream after it.
// The connection's life is the lease's life: while the client keeps it
// open the lease (or its place in the queue) is held; when the client
// closes it, mpsd releases the lease once the lease's processes are gone.
//
//   - queued{position, group, reason, lease_id}: waiting; position 1 is
//     next in the group's queue; reason, when set, says what it waits for
//     (room, an instance that is drained, quarantined or recovering, or
//     mpsd's state directory, which it cannot write: no lease is granted
//     until it can; mpsd always sets it);
//     lease_id, when set, is the waiting lease's id, to resume it by. Sent
//     again whenever the position or the reason changes.
//   - granted{lease}: the lease is placed, and recorded in mpsd's state
//     file (mpsd sends it only then, so that a restart of mpsd never
//     loses a lease a client was told of). Lease.Env is the MPS environment
//     of the workload (CUDA_MPS_PIPE_DIRECTORY,
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
//     MPSD_LEASE_ID, MPSD_GROUP, MPSD_ATTEMPT, MPSD_PROCS); the client adds
//     it to the caller's environment. Attempts count from 1. A lease of
//     LeaseRequest.Procs N processes has its SM divided among them: the
//     thread percentage of Env is each process's part, sm/N rounded down
//     (Lease.Procs says N).
//   - revoked{reason}: a fault took the lease's instance down. mpsd sends
//     this before it stops the lease's processes (terminate_client, then
//     killing the lease's cgroup), so a client that sees its command die
//     can tell a revocation from the command's own end. The client must not
//     kill the command itself: MPS needs terminate_client to come first.
//   - requeued{attempt}: the revoked lease is back in its queue; attempt is
//     the number of the next run (2 for the first requeue). Queued and a
//     new granted (with Lease.Attempt = attempt) follow.
//   - error{code, message}: the request failed for good (ErrorCode says
//     why). Message is one line meant for people.
//
// Reconnecting: if the stream ends without an error event (mpsd restarted),
// the client sends the same request again with ResumeLeaseID set to its
// lease and Attempt to the run in progress; mpsd answers where the lease
// stands now: granted with the same lease if it still runs that attempt
// (the command keeps running); revoked{reason} if a fault revoked it
// meanwhile (or is revoking it), then requeued{attempt} with the current
// attempt and granted or queued as for any requeued lease; or an error
// with CodeNotFound if mpsd does not know the lease. A client still queued
// resumes the same way with the lease id of its queued events and Attempt
// 1 (or the requeued attempt it waits for), and keeps its place in the
// queue: mpsd keeps queued leases across a restart, as far as its state
// file had recorded them when it went. A client whose lease mpsd does not
// know (CodeNotFound) and under which nothing ran, or that was never told
// a lease id, sends the request again without ResumeLeaseID and joins the
// queue afresh.
//
// A restarting mpsd cannot answer: its socket refuses connections, or a
// connection it had accepted is reset or closed before the response
// headers, or a stream ends before its first event. mps-launch takes each
// of these as mpsd being away and retries (with backoff) until mpsd sends
// an event again or the outage has lasted its reconnect window (a minute),
// for the lease request and the attach alike: a command granted just
// before mpsd went waits, unstarted, until its attach succeeds. Past the
// window it exits 75. A command that ends while mpsd is away is reported
// (its status) once the launcher has resumed the lease and closed it, so
// the restarted mpsd frees its share at once, or once the window is over.
// Only a socket that is not there at all, before it was ever found, fails
// at once (exit 125): that is no mpsd, or another socket meant.
//
// Several processes: LeaseRequest.Procs declares how many CUDA processes
// the lease runs (a server with N workers, each an MPS client). mpsd
// admits the lease's whole sm and mem as for one, charges it N of the
// instance's clients (max_clients), and gives every process the thread
// percentage sm/N rounded down; N above sm, above MaxProcs or above the
// group's max_clients is refused with the bound. MPS limits each process:
// a lease that starts more processes than it declared gets sm/N for each
// of them, so together they can take more than sm; status shows, per
// running lease, the MPS clients mpsd saw (LeaseStatus.Clients) beside
// Procs. The memory limit is the lease's whole mem for each process, and
// mpsd holds the sum over the lease's processes to it.
//
// Batch systems: LeaseRequest.GPUSelect confines a lease to the GPUs a job
// was given (NVML indexes, UUIDs or prefixes; unknown ones, and GPUs where
// the group has no whole instance, are refused with CodeRefused, naming the
// group's GPUs); LeaseRequest.JobID tags it with the job, shown in status.
// A request without a group runs in the caller's only group, or the one
// whose default_for names it; a caller of several groups without a default
// is refused with CodeRefused, naming them.
//
// POST /v1/leases/{id}/attach (AttachPath), body AttachRequest, sent on a
// second connection while the lease stream is open. mpsd checks that the
// caller's uid owns the lease and that the pid is a child of the caller's
// process, moves it into the lease's cgroup and answers 200 (body {}). mpsd
// holds a pidfd on the pid from before its checks to after the move, so a
// pid that exits (or is reused) meanwhile is refused with 409
// CodeConflict and nothing else is left in the lease's cgroup. The
// client runs the user's program in that process only after the 200, so the
// program starts inside the cgroup; the client itself stays outside, so a
// cgroup kill never takes it down. Failures answer an Error body: 400
// CodeBadRequest, 403 CodeForbidden (not the caller's lease or not its
// child), 404 CodeNotFound (no such lease), 409 CodeConflict (the lease is
// not running).
//
// A lease request may name the process to attach instead
// (LeaseRequest.AttachPID): mpsd attaches it with the lease's first grant,
// with the same checks, before it writes that granted event, and the
// event's Lease.AttachedPID names it; the attach request is then not
// needed. A pid that fails a check is left where it is and the grant
// names none: the client attaches as above and meets the refusal. An mpsd
// older than a field refuses the request with 400 CodeBadRequest naming it
// as unknown (it decodes strictly); for attach_pid and will_attach (lease
// request) and attempt (attach request), hints an older mpsd does without,
// mps-launch then asks again without them.
//
// GET /v1/status returns a Status document (mpsctl status --json). The
// document is versioned apart from the protocol: Status.SchemaVersion is
// StatusSchemaVersion. Within a schema version fields are only added
// (appended to their object; a reader ignores what it does not know),
// never renamed, retyped, dropped or given another meaning; a change
// that would break a reader of the document bumps the version, and mpsd
// says so in the release notes. The values of an instance's State are an
// open set within a version: a reader treats one it does not know as not
// ready (closed to new leases). InstanceDrained and InstanceRetiring were
// added so (LevelOperatorView); an mpsd before them showed both as
// InstanceDraining. Queued leases carry their Position in
// their group's queue (the order mpsd grants in), their QueuedSince and
// the WaitReason their launcher's queued event gives; running ones their
// RunningSince (this attempt's grant), the device memory NVML reports for
// their processes (MemUsedBytes) and the MPS clients seen among them
// (Clients); both carry the request's Command and JobID, their SM share
// and the Procs it is divided among (SMPerProcess each). Instances carry Drained, while quarantined, the
// QuarantineReason and, while their control daemon does not start, the
// LastStartError; Multiuser says that the instance's one MPS server serves
// every member, so that a lease's SM share there is advisory. What it shows depends on who asks: an admin (admins in the config) sees every
// lease with its uid, pids and job id, and every instance with its daemon
// and server pids and its Servers (each live MPS server's uid and its
// clients of leases and of no lease, as the last reconciliation counted
// them), its Unleased clients (pid, uid, server, device memory), their
// memory and all its clients' (UnleasedMemBytes, MemUsedBytes) and the
// uid MPS serves (ServingUID). A lease carries the pid of the launcher
// that holds it now (LauncherPID; none for a pod's). Anyone else sees
// only its own leases (in full), the
// per-group counts of running (Status.Running) and queued (Status.Queue)
// leases of everyone, and the instances' states and allocations without
// any pid; Status.OwnOnly says the document is so restricted. Other
// tenants' uids, pids and job ids are never shown to a non-admin.
//
// POST /v1/leases/{id}/release (ReleasePath), body ReleaseRequest (the
// attempt whose command ended, and its exit status for the history; {}
// from an older client), sent by the lease's launcher on a second
// connection once its command has ended, before it closes the lease
// stream: mpsd releases the lease as a closed stream would (its processes
// are killed, its capacity handed back) and answers 200 {} once the lease
// is gone and its end is in the history file, so that status no longer
// shows it, and history does, by the time the launcher exits. 403 CodeForbidden: not
// the caller's lease; 404 CodeNotFound: no such lease (it ended already);
// 409 CodeRevoking: it is being revoked, a fault pending on its instance
// will revoke it, or the attempt named was revoked already (the lease is
// at a later one): the stream's revoked event (and requeued) comes, or has
// come, and says how it goes on; a launcher whose command failed waits for
// it. While a fault record naming the lease waits for the Xid that would
// confirm it (docs/security.md), mpsd holds the answer until it is
// confirmed or not, at most a few seconds. 409
// CodeConflict: its processes would not die (it stays, and is released
// once they do), or the attempt named is one the lease never reached. A
// launcher that never sends it loses nothing: closing the stream releases
// the lease too, a moment later.
//
// GET /v1/history (PathHistory), query since (RFC 3339), user (a uid or a
// name) and group, each optional and at most once (ParseHistoryQuery;
// anything else is 400 CodeBadRequest), returns a History: the ended
// leases that match, oldest first, at most MaxHistoryRecords of the
// newest (Truncated says more matched). A non-admin gets its own records
// only (History.OwnOnly), whatever user it names.
//
// POST /v1/leases/{id}/pod (PodPath), body BindPodRequest, root only and
// for the caller's own running lease: the kubelet device plugin names the
// running container that holds the lease's units (the kubelet's
// PodResources API) and a process of it (the container runtime's); mpsd
// reads the container's cgroups from the kernel through that process,
// keeps those named after the container's id, and from then on takes the
// processes in them for the lease's (LeaseStatus.Pod and PIDs), as it
// takes an mps-launch lease's cgroup. A later binding (the container
// restarted) replaces it. 200 {}; 403 CodeForbidden: the caller is not
// root or the lease not its; 404 CodeNotFound; 409 CodeConflict: the
// lease is not running; 422 CodeRefused: the process is gone or in no
// cgroup named after the container id.
//
// GET /v1/version (PathVersion) answers anyone with a Version: mpsd's
// version and commit (as its --version line says them) and the API level
// it serves. Every answer of mpsd, whatever its path or status (a lease
// stream, a refusal, the 503 of a connection over a cap), carries its
// version in the Mpsd-Version header (HeaderVersion) and its level in
// Mpsd-Api-Level (HeaderAPILevel); the status document carries the
// Version as Status.Mpsd. API levels (LevelBase, LevelOperatorView, ...,
// APILevel) number what v1 added over time; an answer without the level
// header comes from an mpsd of LevelBase. A client compares the level
// with the newest one it uses and says so, once, when mpsd's is lower:
// mpsd would refuse what it is about to send. A later level serves every
// earlier one, so an mpsd newer than its clients is never a skew.
//
// Every request body is one JSON object: null, an array, a number or a
// string is refused with 400 CodeBadRequest, never taken as an empty
// request.
//
// Limits (config section limits): mpsd caps the connections on its socket
// in all and per uid (SO_PEERCRED, taken when the connection is
// accepted). A connection over a cap is answered 503 with CodeOverLimit
// and a message naming the cap and its config key, then closed, before
// any request on it is read. A new lease request of a uid that already
// has limits.queued_per_user requests queued is refused with 429
// CodeOverLimit. CodeOverLimit is temporary (mps-launch exits 75): the
// caller's own connections and queued requests ending frees the cap.
//
// POST /v1/drain and POST /v1/resume (admins only, by peer credentials),
// body AdminTarget, answer an AdminResult listing the instances changed.
// Drain closes instances to new leases while running ones go on; resume
// reopens drained or quarantined ones. Both are saved in mpsd's state file
// before the answer and hold across restarts of mpsd; if the file cannot
// be written within the request timeout the change applies but the answer
// is 503 CodeUnavailable saying it is not yet saved. POST /v1/restart (AdminTarget)
// restarts the instances' control daemons, revoking and requeueing their
// leases; POST /v1/requeue (RequeueRequest) does that to one lease; both
// answer an AdminResult. POST /v1/inject-xid (InjectXidRequest) raises a
// simulated Xid and answers {}; an mpsd on real GPUs refuses it with 409
// CodeConflict. The resume's AdminResult.Lifted says per instance what it
// lifted: a drain, a quarantine (with the reason it had been quarantined
// for), both or nothing. A drain's AdminTarget.Reason (one printable line,
// MaxReasonBytes) is recorded with the admin who drained and when, saved
// with the drain and shown in InstanceStatus (DrainReason, DrainedBy,
// DrainedAt) until the resume; AdminResult.Already says per instance that
// it was drained before (the request then changed nothing but a new
// reason). An instance drained and empty shows the state InstanceDrained,
// one leaving the config InstanceRetiring (an mpsd before them showed
// both as draining).
//
// POST /v1/cancel (PathCancel), body CancelRequest, by the lease's owner or
// an admin (403 CodeForbidden for anyone else, 404 CodeNotFound for no
// such lease, 409 CodeConflict for a lease already ending), ends a lease
// for good: a queued one leaves its queue; a running one is revoked
// (revoked{reason} naming who cancelled it), with Signal set its
// processes are sent that signal and given GraceMs to end, then MPS and
// its cgroup's kill end what is left; it is not requeued. Its stream ends
// with an error event CodeCancelled naming who cancelled it, and the
// answer, a CancelResult, comes once the lease has ended.
//
// POST /v1/shutdown (PathShutdown, admins only), body {}
// (ShutdownRequest), shuts the host's MPS service down, where SIGTERM
// stops mpsd only: mpsd refuses new lease requests (503 CodeUnavailable)
// and grants nothing more; every queued request ends with an error event
// CodeUnavailable; every running lease is revoked (revoked{reason} naming
// the shutdown, terminate_client, its cgroup killed) and then ends with an
// error event CodeUnavailable, not requeued, so mps-launch exits 75 and
// says why; then the MPS control daemons quit, the GPUs' compute modes are
// put back, the state file is written (no leases), and mpsd answers a
// ShutdownResult and exits. A second shutdown while one runs answers 409
// CodeConflict. 403 CodeForbidden for a caller who is not an admin, 404
// CodeNotFound when the target names no instance or lease.
//
// Error codes and what mps-launch makes of them: CodeWaitTimeout,
// CodeAttemptsExhausted, CodeUnavailable and CodeOverLimit are temporary
// (exit 75); every
// other code, including ones this version does not know, is a refusal or
// failure (exit 125): CodeLimitExceeded, a lease revoked for going over its
// limits, among them (running it again would do the same). CodeCancelled
// has its own exit status, 122: the job is not to be tried again.
package api
