package api

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Where and how the API is reached.
const (
	// DefaultSocket is mpsd's API socket when neither --socket nor
	// EnvSocket says otherwise (docs/architecture.md#files-on-a-host).
	DefaultSocket = "/run/mpsd/mpsd.sock"
	// EnvSocket names the environment variable that overrides DefaultSocket
	// for mps-launch and mpsctl.
	EnvSocket = "MPSD_SOCKET"

	// PathLeases is where a LeaseRequest is posted.
	PathLeases = "/v1/leases"
	// PathStatus returns the Status document.
	PathStatus = "/v1/status"
	// PathDrain closes the instances an AdminTarget names to new leases;
	// running leases go on. Admins only.
	PathDrain = "/v1/drain"
	// PathResume reopens drained (or quarantined) instances. Admins only.
	PathResume = "/v1/resume"
	// PathRestart restarts the control daemons of the instances an
	// AdminTarget names; their leases are revoked and requeued. Admins
	// only.
	PathRestart = "/v1/restart"
	// PathRequeue revokes one running lease and puts it back at the head
	// of its group's queue (RequeueRequest). Admins only.
	PathRequeue = "/v1/requeue"
	// PathShutdown ends mpsd and what it runs (ShutdownRequest): the
	// leases are ended, the MPS daemons quit, the compute modes restored,
	// then mpsd exits. Admins only.
	PathShutdown = "/v1/shutdown"
	// PathInjectXid raises a simulated Xid (InjectXidRequest); only an
	// mpsd running with --simulate accepts it. Admins only.
	PathInjectXid = "/v1/inject-xid"

	// ContentTypeJSON is the type of every request and non-stream body.
	ContentTypeJSON = "application/json"
	// ContentTypeNDJSON is the type of the lease event stream.
	ContentTypeNDJSON = "application/x-ndjson"
	// HeaderLeaseID names, in a lease stream's answer, the lease the
	// stream is for, before any event: a client whose stream ends before
	// its first event (mpsd killed between a grant's state write and its
	// event) resumes that lease by id instead of asking anew.
	HeaderLeaseID = "Mpsd-Lease-Id"

	// MaxRequestBytes bounds a request body; mpsd answers 413 beyond it.
	MaxRequestBytes = 64 << 10
	// MaxEventBytes bounds one event line (and an Error body).
	MaxEventBytes = 64 << 10
	// MaxCommandBytes bounds LeaseRequest.Command, all arguments together.
	MaxCommandBytes = 16 << 10
	// MaxLeaseIDLen bounds a lease id.
	MaxLeaseIDLen = 128
)

// Environment variables of a lease's workload
// (docs/architecture.md#environment-of-a-lease).
const (
	EnvPipeDirectory    = "CUDA_MPS_PIPE_DIRECTORY"
	EnvThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvPinnedMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvLeaseID          = "MPSD_LEASE_ID"
	EnvGroup            = "MPSD_GROUP"
	EnvAttempt          = "MPSD_ATTEMPT"
	// EnvProcs is the number of processes the lease's SM share is divided
	// among (LeaseRequest.Procs; 1 unless it said more).
	EnvProcs = "MPSD_PROCS"
)

const (
	attachSuffix  = "/attach"
	releaseSuffix = "/release"
)

// EnvClientPriority is MPS's client priority in a lease's environment (0
// normal, 1 below normal), set where the driver's MPS has it.
const EnvClientPriority = "CUDA_MPS_CLIENT_PRIORITY"

var (
	// ErrInvalid is wrapped by every decoder and Validate when a message is
	// not well-formed JSON of the expected shape or a value is out of range.
	ErrInvalid = errors.New("api: invalid message")
	// ErrTooLarge is wrapped when a body or event line exceeds its bound.
	ErrTooLarge = errors.New("api: message too large")
)

// AttachPath is where an AttachRequest for lease id is posted. The id is
// path-escaped, though ValidLeaseID ids never need it.
func AttachPath(id string) string {
	return PathLeases + "/" + url.PathEscape(id) + attachSuffix
}

// ReleasePath is where a launcher whose command has ended posts a
// ReleaseRequest to have lease id released at once; mpsd answers once the
// lease is gone.
func ReleasePath(id string) string {
	return PathLeases + "/" + url.PathEscape(id) + releaseSuffix
}

// LeaseIDFromAttachPath returns the lease id of an AttachPath, and false
// for any other path.
func LeaseIDFromAttachPath(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, PathLeases+"/")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, attachSuffix)
	if !ok || ValidLeaseID(id) != nil {
		return "", false
	}
	return id, true
}

// ValidLeaseID reports whether id can name a lease: 1 to MaxLeaseIDLen
// ASCII letters, digits, '.', '_' or '-', not starting with '.', so it is
// safe in a URL path, a cgroup name and a file name alike.
func ValidLeaseID(id string) error {
	if id == "" || len(id) > MaxLeaseIDLen {
		return fmt.Errorf("%w: lease id %q: want 1 to %d characters", ErrInvalid, id, MaxLeaseIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("%w: lease id %q starts with '.'", ErrInvalid, id)
	}
	for _, c := range []byte(id) {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("%w: lease id %q: only letters, digits, '.', '_' and '-'", ErrInvalid, id)
		}
	}
	return nil
}

// LeaseRequest is the body of POST /v1/leases. Zero values mean "the
// group's default" where the comment says so.
type LeaseRequest struct {
	// SM is the percent of each GPU's SMs, 1-100; 0 takes the group's
	// default_sm.
	SM int `json:"sm,omitempty"`
	// MemBytes is the pinned device memory per GPU; 0 takes the group's
	// default_mem.
	MemBytes int64 `json:"mem_bytes,omitempty"`
	// GPUs is how many GPUs: 0 means the group's instance size
	// (gpus_per_instance), the only other number allowed.
	GPUs int `json:"gpus,omitempty"`
	// Group names the tenant group; empty takes the caller's only group,
	// or the one whose default_for names it (else the request is refused).
	Group string `json:"group,omitempty"`
	// RequeueAttempts caps how often a revoked lease is requeued: absent
	// takes the group's requeue_attempts, 0 never requeues, N requeues at
	// most min(N, the group's requeue_attempts) times.
	RequeueAttempts *int `json:"requeue_attempts,omitempty"`
	// WaitMillis bounds the time spent queued, in milliseconds; 0 waits
	// for ever. When it passes, mpsd sends an error with CodeWaitTimeout.
	WaitMillis int64 `json:"wait_ms,omitempty"`
	// NoWait refuses to queue at all: if the lease cannot be placed now,
	// mpsd sends an error with CodeWaitTimeout. Excludes WaitMillis.
	NoWait bool `json:"no_wait,omitempty"`
	// Command is the argv the lease runs, for display in status only; mpsd
	// never runs it.
	Command []string `json:"command,omitempty"`
	// ResumeLeaseID reconnects to a lease after mpsd restarted.
	ResumeLeaseID string `json:"resume_lease_id,omitempty"`
	// Attempt is the run in progress when resuming (1 for the first run);
	// 0 otherwise.
	Attempt int `json:"attempt,omitempty"`
	// GPUSelect confines the lease to instances whose GPUs are all among
	// these, each an NVML index, a GPU UUID or a UUID prefix: what a batch
	// system handed the job (Slurm's CUDA_VISIBLE_DEVICES, the devices a
	// kubelet allocated). Empty: any GPU of the group.
	GPUSelect []string `json:"gpu_select,omitempty"`
	// JobID names the batch job the lease belongs to (a Slurm job id, a
	// pod), for status and logs; mpsd does not interpret it.
	JobID string `json:"job_id,omitempty"`
	// WillAttach says the client attaches its command's process once
	// granted (mps-launch does): mpsd then makes the lease's cgroup at the
	// grant, while the grant travels and the command starts, so that the
	// attach only moves the process. Without it the cgroup is made at the
	// first attach, and a lease nothing is attached to (a device plugin's,
	// an API client's) costs no cgroup.
	WillAttach bool `json:"will_attach,omitempty"`
	// AttachPID is a waiting child of the caller (mps-launch's
	// trampoline) that mpsd moves into the lease's cgroup with its first
	// grant, as an attach of that attempt would, checked as one is (the
	// caller's own child, of its uid, alive): the grant then names it in
	// Lease.AttachedPID and no attach round trip is needed. A pid that
	// fails the checks is not attached and the grant does not name it
	// (the client's own attach then says why). Ignored on a resume. 0:
	// none.
	AttachPID int `json:"attach_pid,omitempty"`
	// Procs is how many CUDA processes the lease runs (a server with
	// that many workers): its SM share is divided among them, each
	// process getting CUDA_MPS_ACTIVE_THREAD_PERCENTAGE sm/procs rounded
	// down, and each counts as one of the instance's clients. 1 to
	// MaxProcs, and at most the lease's sm (so no process gets under 1%);
	// 0 means 1.
	Procs int `json:"procs,omitempty"`
}

// Bounds of the batch-system fields of a LeaseRequest.
const (
	MaxGPUSelect = 64
	MaxJobIDLen  = 128
)

// MaxProcs bounds LeaseRequest.Procs: MPS serves at most 48 clients per
// GPU (policy.MaxClientsLimit), so a lease cannot run more processes on
// one; a group's max_clients may bound it lower.
const MaxProcs = 48

// MaxWaitMillis is the longest wait_ms a request may ask for: the most
// milliseconds a time.Duration holds (about 292 years).
const MaxWaitMillis = int64(1<<63-1) / int64(time.Millisecond)

// Validate checks the ranges the protocol fixes; the group's own limits
// are mpsd's policy, not checked here. The error wraps ErrInvalid and names
// every field that is wrong.
func (r LeaseRequest) Validate() error {
	var why []string
	if r.SM < 0 || r.SM > 100 {
		why = append(why, fmt.Sprintf("sm %d: want 1 to 100, or 0 for the group's default", r.SM))
	}
	if r.MemBytes < 0 {
		why = append(why, fmt.Sprintf("mem_bytes %d is negative", r.MemBytes))
	}
	if r.GPUs < 0 {
		why = append(why, fmt.Sprintf("gpus %d is negative", r.GPUs))
	}
	if r.RequeueAttempts != nil && *r.RequeueAttempts < 0 {
		why = append(why, fmt.Sprintf("requeue_attempts %d is negative", *r.RequeueAttempts))
	}
	switch {
	case r.WaitMillis < 0:
		why = append(why, fmt.Sprintf("wait_ms %d is negative", r.WaitMillis))
	case r.WaitMillis > MaxWaitMillis:
		why = append(why, fmt.Sprintf("wait_ms %d is more than %d (a wait that long is no time.Duration)", r.WaitMillis, MaxWaitMillis))
	}
	if r.NoWait && r.WaitMillis != 0 {
		why = append(why, "no_wait and wait_ms exclude each other")
	}
	if r.AttachPID < 0 {
		why = append(why, fmt.Sprintf("attach_pid %d is negative", r.AttachPID))
	}
	n := 0
	for _, a := range r.Command {
		n += len(a)
	}
	if n > MaxCommandBytes {
		why = append(why, fmt.Sprintf("command is %d bytes, more than %d", n, MaxCommandBytes))
	}
	if r.ResumeLeaseID != "" {
		if err := ValidLeaseID(r.ResumeLeaseID); err != nil {
			why = append(why, "resume_lease_id: "+strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
		if r.Attempt < 1 {
			why = append(why, fmt.Sprintf("attempt %d: a resumed lease is on attempt 1 or later", r.Attempt))
		}
	} else if r.Attempt != 0 {
		why = append(why, "attempt is only sent with resume_lease_id")
	}
	if r.Procs < 0 || r.Procs > MaxProcs {
		why = append(why, fmt.Sprintf("procs %d: want 1 to %d processes (MPS serves at most %d clients per GPU), or 0 for 1", r.Procs, MaxProcs, MaxProcs))
	} else if r.SM > 0 && r.Procs > r.SM {
		why = append(why, fmt.Sprintf("procs %d is more than sm %d: each process would get under 1%% of the SMs", r.Procs, r.SM))
	}
	if len(r.GPUSelect) > MaxGPUSelect {
		why = append(why, fmt.Sprintf("gpu_select has %d entries, more than %d", len(r.GPUSelect), MaxGPUSelect))
	}
	for _, g := range r.GPUSelect {
		if g == "" || len(g) > 128 {
			why = append(why, fmt.Sprintf("gpu_select entry %q: want 1 to 128 bytes", g))
			break
		}
	}
	if len(r.JobID) > MaxJobIDLen {
		why = append(why, fmt.Sprintf("job_id is %d bytes, more than %d", len(r.JobID), MaxJobIDLen))
	} else if strings.IndexFunc(r.JobID, func(c rune) bool { return c < 0x20 || c == 0x7f || c == utf8.RuneError }) >= 0 {
		why = append(why, fmt.Sprintf("job_id %q has control characters or is not UTF-8", r.JobID))
	}
	if len(why) > 0 {
		return fmt.Errorf("%w: lease request: %s", ErrInvalid, strings.Join(why, "; "))
	}
	return nil
}

// AttachRequest is the body of POST /v1/leases/{id}/attach.
type AttachRequest struct {
	// PID is the caller's child to move into the lease's cgroup.
	PID int `json:"pid"`
	// Attempt is the run the child is for, the attempt of the grant the
	// caller acts on: mpsd refuses the attach (409, CodeConflict) when the
	// lease is at another, so a child started for an attempt that was
	// revoked and granted again elsewhere meanwhile never joins the new
	// one (it would run with the old instance's MPS environment). 0, from
	// a client older than the field, is not checked.
	Attempt int `json:"attempt,omitempty"`
}

// Validate checks that PID can name another process.
func (a AttachRequest) Validate() error {
	if a.Attempt < 0 {
		return fmt.Errorf("%w: attach: attempt %d", ErrInvalid, a.Attempt)
	}
	if a.PID <= 1 {
		return fmt.Errorf("%w: attach: pid %d is not a child process", ErrInvalid, a.PID)
	}
	return nil
}

// Lease is a granted lease as the client sees it.
type Lease struct {
	ID         string            `json:"id"`
	Group      string            `json:"group"`
	GPUIndexes []int             `json:"gpu_indexes"`
	GPUUUIDs   []string          `json:"gpu_uuids"`
	SM         int               `json:"sm"`
	MemBytes   int64             `json:"mem_bytes"`
	Attempt    int               `json:"attempt"`
	Env        map[string]string `json:"env"`
	// Procs is the request's Procs (absent: 1): SM is divided among that
	// many processes, and Env's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is each
	// one's part.
	Procs int `json:"procs,omitempty"`
	// AttachedPID is the LeaseRequest.AttachPID that mpsd moved into the
	// lease's cgroup with this grant (absent: none was).
	AttachedPID int `json:"attached_pid,omitempty"`
}

// Validate checks the lease's id, ranges and environment.
func (l *Lease) Validate() error {
	if err := ValidLeaseID(l.ID); err != nil {
		return err
	}
	if l.Group == "" {
		return fmt.Errorf("%w: lease %s: no group", ErrInvalid, l.ID)
	}
	if l.SM < 1 || l.SM > 100 {
		return fmt.Errorf("%w: lease %s: sm %d: want 1 to 100", ErrInvalid, l.ID, l.SM)
	}
	if l.MemBytes < 0 {
		return fmt.Errorf("%w: lease %s: mem_bytes %d is negative", ErrInvalid, l.ID, l.MemBytes)
	}
	if l.Attempt < 1 {
		return fmt.Errorf("%w: lease %s: attempt %d: attempts count from 1", ErrInvalid, l.ID, l.Attempt)
	}
	if l.Procs < 0 || l.Procs > MaxProcs || l.Procs > l.SM {
		return fmt.Errorf("%w: lease %s: procs %d: want 1 to %d, at most its sm %d", ErrInvalid, l.ID, l.Procs, MaxProcs, l.SM)
	}
	for k, v := range l.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: lease %s: environment entry %q=%q cannot be passed to a program", ErrInvalid, l.ID, k, v)
		}
	}
	return nil
}

// EventType names a lease event.
type EventType string

// The lease events, in the order of the grammar in the package doc.
const (
	EventQueued   EventType = "queued"
	EventGranted  EventType = "granted"
	EventRevoked  EventType = "revoked"
	EventRequeued EventType = "requeued"
	EventError    EventType = "error"
)

// Event is one line of the lease stream. Only the fields of its Type are
// set.
type Event struct {
	Type EventType `json:"type"`
	// Position (queued) is 1 for the next request of the group's queue.
	Position int `json:"position,omitempty"`
	// Group (queued) is the group the request waits in.
	Group string `json:"group,omitempty"`
	// LeaseID (queued), when set, is the id of the waiting lease: a
	// client reconnecting after mpsd restarted resumes it by this id
	// (LeaseRequest.ResumeLeaseID) and so keeps its place in the queue.
	LeaseID string `json:"lease_id,omitempty"`
	// Lease (granted).
	Lease *Lease `json:"lease,omitempty"`
	// Reason (revoked) says in one line why the lease was revoked; on a
	// queued event, optionally, what the request waits for (an instance
	// quarantined or recovering, or simply room).
	Reason string `json:"reason,omitempty"`
	// Attempt (requeued) is the number of the next run, 2 or more.
	Attempt int `json:"attempt,omitempty"`
	// Code and Message (error).
	Code    ErrorCode `json:"code,omitempty"`
	Message string    `json:"message,omitempty"`
}

// Validate checks the fields Type requires.
func (e *Event) Validate() error {
	switch e.Type {
	case EventQueued:
		if e.Position < 1 {
			return fmt.Errorf("%w: queued event: position %d: positions count from 1", ErrInvalid, e.Position)
		}
		if e.LeaseID != "" {
			return ValidLeaseID(e.LeaseID)
		}
	case EventGranted:
		if e.Lease == nil {
			return fmt.Errorf("%w: granted event without a lease", ErrInvalid)
		}
		return e.Lease.Validate()
	case EventRevoked:
		if e.Reason == "" {
			return fmt.Errorf("%w: revoked event without a reason", ErrInvalid)
		}
	case EventRequeued:
		if e.Attempt < 2 {
			return fmt.Errorf("%w: requeued event: attempt %d: a requeued run is attempt 2 or later", ErrInvalid, e.Attempt)
		}
	case EventError:
		if e.Message == "" {
			return fmt.Errorf("%w: error event without a message", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: unknown event type %q", ErrInvalid, e.Type)
	}
	return nil
}

// ErrorCode says why a request failed; clients branch on it.
type ErrorCode string

// The error codes of version 1.
const (
	// CodeBadRequest: malformed or out-of-range request.
	CodeBadRequest ErrorCode = "bad_request"
	// CodeTooLarge: the request body exceeds MaxRequestBytes.
	CodeTooLarge ErrorCode = "too_large"
	// CodeRefused: policy refuses the request for good (not a member of
	// the group, unknown group, can never fit, above the group's max).
	CodeRefused ErrorCode = "refused"
	// CodeForbidden: the caller may not act on this lease or pid.
	CodeForbidden ErrorCode = "forbidden"
	// CodeNotFound: no such lease (also: a resumed lease mpsd lost).
	CodeNotFound ErrorCode = "not_found"
	// CodeConflict: the lease is not in a state that allows the action.
	CodeConflict ErrorCode = "conflict"
	// CodeWaitTimeout: wait_ms passed, or no_wait and no room now.
	CodeWaitTimeout ErrorCode = "wait_timeout"
	// CodeAttemptsExhausted: revoked with no requeue attempts left.
	CodeAttemptsExhausted ErrorCode = "attempts_exhausted"
	// CodeUnavailable: temporarily cannot serve (group draining, mpsd
	// shutting down).
	CodeUnavailable ErrorCode = "unavailable"
	// CodeInternal: mpsd failed.
	CodeInternal ErrorCode = "internal"
	// CodeOverLimit: the caller is at one of mpsd's resource caps (its
	// connections, everyone's connections, its queued requests); the
	// message names the cap and its config key. Temporary: the caller's
	// own connections and requests ending frees it.
	CodeOverLimit ErrorCode = "over_limit"
	// CodeLimitExceeded: the lease's processes went over its limits (the
	// device memory NVML reports for them above its mem for longer than
	// the group's memory_grace): it was revoked and is not requeued.
	CodeLimitExceeded ErrorCode = "limit_exceeded"
	// CodeRevoking: a release refused because the lease is being revoked,
	// or a fault pending on its instance is about to revoke it: the
	// stream's revoked event follows, then its requeue or its end.
	CodeRevoking ErrorCode = "revoking"
	// CodeCancelled: the lease's owner or an admin cancelled it (mpsctl
	// cancel): it ended for good, its command stopped, and is not
	// requeued. The message names who cancelled it.
	CodeCancelled ErrorCode = "cancelled"
)

// Temporary reports whether trying again later may succeed: the codes
// mps-launch maps to exit status 75 (EX_TEMPFAIL).
func (c ErrorCode) Temporary() bool {
	switch c {
	case CodeWaitTimeout, CodeAttemptsExhausted, CodeUnavailable, CodeOverLimit:
		return true
	}
	return false
}

// Error is the body of every non-2xx response, and the content of an error
// event.
type Error struct {
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
}

// Error returns the message, which already says what failed.
func (e *Error) Error() string { return e.Message }

// StatusSchemaVersion is the version of the Status document mpsd sends in
// Status.SchemaVersion. Within a version fields are only ever added, never
// renamed, retyped or given another meaning; a change that breaks a reader
// of the document gets the next version (api/doc.go).
const StatusSchemaVersion = 1

// Status is the document of GET /v1/status (mpsctl status --json).
type Status struct {
	Instances []InstanceStatus `json:"instances"`
	Leases    []LeaseStatus    `json:"leases"`
	// Queue is the number of queued requests per group, everyone's.
	Queue map[string]int `json:"queue"`
	// Running is the number of running leases per group, everyone's; set
	// when OwnOnly is.
	Running map[string]int `json:"running,omitempty"`
	// OwnOnly: the caller is not an admin, so Leases lists only its own
	// leases, and instances carry no pids (DaemonPID 0, ServerPIDs empty,
	// no Servers).
	OwnOnly bool `json:"own_only,omitempty"`
	// SchemaVersion is StatusSchemaVersion of the mpsd that sent it.
	SchemaVersion int `json:"schema_version"`
	// At is mpsd's clock when it made the document: the wait and run times
	// of the leases are measured from their times to this one.
	At time.Time `json:"at,omitzero"`
	// Mpsd is the build of the mpsd that sent it and the API level it
	// serves, as GET PathVersion answers (LevelOperatorView; absent from an
	// older mpsd).
	Mpsd *Version `json:"mpsd,omitempty"`
}

// Instance states.
const (
	InstanceStarting    = "starting"
	InstanceReady       = "ready"
	InstanceRecovering  = "recovering"
	InstanceQuarantined = "quarantined"
	InstanceDraining    = "draining"
	// InstanceDrained: drained (mpsctl drain) and empty, no lease left
	// on it: safe to reset its GPU. InstanceRetiring: gone from the
	// config; it stops once its leases have ended. An mpsd before them
	// showed both as draining.
	InstanceDrained  = "drained"
	InstanceRetiring = "retiring"
)

// InstanceStatus is one MPS instance in Status.
type InstanceStatus struct {
	GPUUUID    string `json:"gpu_uuid"`
	GPUIndex   int    `json:"gpu_index"`
	Group      string `json:"group"`
	State      string `json:"state"`
	DaemonPID  int    `json:"daemon_pid"`
	ServerPIDs []int  `json:"server_pids"`
	Clients    int    `json:"clients"`
	Restarts   int    `json:"restarts"`
	// GPUIndexes and GPUUUIDs are the instance's whole GPU set (more than
	// one GPU with gpus_per_instance > 1); GPUIndex and GPUUUID are its
	// first, which names its directories.
	GPUIndexes []int    `json:"gpu_indexes"`
	GPUUUIDs   []string `json:"gpu_uuids"`
	// SMAllocated and MemAllocatedBytes are the sums of the running
	// leases' sm and mem per GPU; SMBudget and MemBudgetBytes the group's
	// per-GPU budget; MaxClients its client limit.
	SMAllocated       int   `json:"sm_allocated"`
	SMBudget          int   `json:"sm_budget"`
	MemAllocatedBytes int64 `json:"mem_allocated_bytes"`
	MemBudgetBytes    int64 `json:"mem_budget_bytes"`
	MaxClients        int   `json:"max_clients"`
	// Drained: mpsctl drain closed it (until mpsctl resume), whatever
	// State shows (a quarantine shows first).
	Drained bool `json:"drained,omitempty"`
	// DrainReason, DrainedBy and DrainedAt (with Drained) are the drain's
	// record: the reason mpsctl drain --reason gave, the admin who drained
	// it (user name, or uid when it has none) and when. They hold, like
	// the drain, across restarts of mpsd; a drain from an mpsd before them
	// has none.
	DrainReason string    `json:"drain_reason,omitempty"`
	DrainedBy   string    `json:"drained_by,omitempty"`
	DrainedAt   time.Time `json:"drained_at,omitzero"`
	// QuarantineReason, while State is quarantined, says why: the
	// failures that quarantined it, the last one's reason among them (an
	// admin's status only: that reason names processes).
	QuarantineReason string `json:"quarantine_reason,omitempty"`
	// DriverVersion is the NVIDIA driver NVML reports ("580.159.04"),
	// whose generation decides what the instance's MPS offers;
	// MPSVersion the version of its MPS control binary ("13000", CUDA
	// 13.0): the driver's CUDA version as NVML reports it, from 580 on,
	// where the binary states one (never read from control.log, which
	// any member can write). Empty before 580 and when unknown.
	DriverVersion string `json:"driver_version,omitempty"`
	MPSVersion    string `json:"mps_version,omitempty"`
	// GPUModel is the product name NVML reports for the instance's first
	// GPU ("NVIDIA A100-SXM4-40GB"); empty when NVML gave none. An mpsd
	// before it sends none.
	GPUModel string `json:"gpu_model,omitempty"`
	// ClientsAllocated is the clients the running leases are charged of
	// MaxClients: one per declared process (LeaseRequest.Procs), where
	// Clients counts the leases. An mpsd before it sends none.
	ClientsAllocated int `json:"clients_allocated,omitempty"`
	// LastStartError is why the last start (or adoption) of the
	// instance's control daemon failed, while it has none that answers
	// (cleared once one does): what keeps it starting. A non-admin sees
	// only that there is one (an admin's status names it: it may name
	// processes and paths).
	LastStartError string `json:"last_start_error,omitempty"`
	// Multiuser: the instance's one MPS server serves every member of
	// its group at once (the group's multiuser), with the group's caps
	// as its limits, so a lease's SM share there is advisory (its memory
	// is still enforced per lease). Elsewhere each uid's server is held
	// to what that uid's leases were granted.
	Multiuser bool `json:"multiuser,omitempty"`
	// Servers are the instance's live MPS servers as mpsd's model of MPS
	// holds them (an admin's status only; a non-admin's has none). An
	// mpsd before them sends none.
	Servers []ServerStatus `json:"servers,omitempty"`
	// Unleased are the MPS clients of the instance's servers that no
	// lease accounts for, as mpsd's last reconciliation confirmed them
	// (sorted by pid); UnleasedMemBytes their device memory, summed per
	// GPU, on the instance's GPU where it is highest; MemUsedBytes the
	// device memory of all its MPS clients, the leases' and these, the
	// same way: what MPS holds on it, beside MemAllocatedBytes, what its
	// leases were granted. Absent until a reconciliation has read them.
	// An admin's status only (a non-admin's has none of the three).
	Unleased         []UnleasedClient `json:"unleased,omitempty"`
	UnleasedMemBytes int64            `json:"unleased_mem_bytes,omitempty"`
	MemUsedBytes     *uint64          `json:"mem_used_bytes,omitempty"`
	// ServingUID is the uid MPS serves on the instance, as mpsd's model
	// of MPS holds it, on a daemon without multiuser (one uid at a time;
	// other uids' clients wait inside MPS): that of a server clients of
	// no lease hold, else the running leases', else an idle server's.
	// Absent when none of these is, and on a multiuser instance. An
	// admin's status only.
	ServingUID *int `json:"serving_uid,omitempty"`
}

// UnleasedClient is one MPS client of an instance that no lease holds: a
// member who set CUDA_MPS_PIPE_DIRECTORY without mps-launch.
type UnleasedClient struct {
	PID int    `json:"pid"`
	UID uint32 `json:"uid"`
	// Server is the pid of the MPS server it is a client of.
	Server int `json:"server"`
	// MemBytes is the device memory NVML reports for it, summed over the
	// instance's GPUs; absent when NVML does not say.
	MemBytes *uint64 `json:"mem_bytes,omitempty"`
}

// ServerStatus is one live MPS server of an instance.
type ServerStatus struct {
	PID int `json:"pid"`
	// UID is the user it serves (-1: not known). A daemon without
	// multiuser runs one server per uid, and one uid's at a time.
	UID int `json:"uid"`
	// LeasedClients and UnleasedClients are its MPS clients as mpsd's last
	// reconciliation counted them: those of running leases, and those no
	// lease holds. While a server of a daemon without multiuser has
	// unleased clients, MPS makes every other uid's clients wait, so mpsd
	// grants no other uid there.
	LeasedClients   int `json:"leased_clients"`
	UnleasedClients int `json:"unleased_clients"`
	// PendingLeases are the running leases whose clients MPS makes wait
	// behind this server (its pending list, as mpsd infers it by MPS's
	// rule: a daemon without multiuser starts no server for their uid
	// while this one, of another uid, has clients); none while nobody
	// waits.
	PendingLeases []string `json:"pending_leases,omitempty"`
	// Fault: MPS holds the server in FAULT after a client's fatal fault,
	// refusing new clients, because clients of the fault that no lease
	// holds still live (the recovery ended the leased ones): nothing is
	// placed on the instance until a reconciliation counts none.
	Fault bool `json:"fault,omitempty"`
}

// Lease states.
const (
	LeaseQueued  = "queued"
	LeaseRunning = "running"
	// LeaseRevoking is no state status shows (a lease being revoked reads
	// running until it is requeued or ends); a cancel answers it
	// (CancelResult.Was).
	LeaseRevoking = "revoking"
)

// LeaseStatus is one lease in Status.
type LeaseStatus struct {
	ID         string `json:"id"`
	Group      string `json:"group"`
	GPUIndexes []int  `json:"gpu_indexes"`
	UID        uint32 `json:"uid"`
	PIDs       []int  `json:"pids"`
	SM         int    `json:"sm"`
	MemBytes   int64  `json:"mem_bytes"`
	Attempt    int    `json:"attempt"`
	State      string `json:"state"`
	// JobID is the LeaseRequest's, when it gave one.
	JobID string `json:"job_id,omitempty"`
	// Command is the LeaseRequest's, for display.
	Command []string `json:"command,omitempty"`
	// QueuedSince (queued) is when it joined its queue, first or after
	// its last requeue; RunningSince (running) when this attempt was
	// granted.
	QueuedSince  time.Time `json:"queued_since,omitzero"`
	RunningSince time.Time `json:"running_since,omitzero"`
	// Position (queued) is its place in its group's queue, 1 next, in the
	// order mpsd grants in; WaitReason what it waits for, as the queued
	// event tells its launcher.
	Position   int    `json:"position,omitempty"`
	WaitReason string `json:"wait_reason,omitempty"`
	// MemUsedBytes is the device memory NVML last reported for the
	// lease's processes, summed over them, on the lease's GPU where it is
	// highest (what is held to MemBytes); absent until mpsd has read it.
	MemUsedBytes *uint64 `json:"mem_used_bytes,omitempty"`
	// Procs is how many processes SM is divided among (LeaseRequest.Procs,
	// 1 unless it said more); SMPerProcess each one's part, the
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE its processes are given (SM/Procs
	// rounded down). An mpsd before them sends neither: read 0 as 1 and SM.
	Procs        int `json:"procs,omitempty"`
	SMPerProcess int `json:"sm_per_process,omitempty"`
	// Clients (running) is how many MPS client processes of the lease
	// mpsd last saw on its GPUs (NVML's MPS clients and MPS's client lists,
	// joined with the lease's cgroup); absent until mpsd has looked. More
	// than Procs means the lease runs more workers than it declared, each
	// with SMPerProcess: together they can take more than SM.
	Clients *int `json:"clients,omitempty"`
	// Pod (running, a kubelet device plugin's lease) is the container
	// whose processes are the lease's (BindPodRequest); PIDs are then that
	// container's processes. Absent until the plugin has bound it, and
	// again after mpsd restarts until the plugin binds it anew.
	Pod *PodContainer `json:"pod,omitempty"`
	// LauncherPID is the process whose lease stream holds the lease now:
	// its mps-launch (after an mpsd restart, the one that resumed it);
	// absent while none does (a launcher away across a restart) and for
	// a pod's lease (Pod set), whose stream is the device plugin's.
	LauncherPID int `json:"launcher_pid,omitempty"`
}

// AdminTarget is the body of PathDrain and PathResume: the instances of
// a GPU, of a group, or (both given) of that group on that GPU.
type AdminTarget struct {
	// GPU is an NVML index, a GPU UUID or a UUID prefix.
	GPU string `json:"gpu,omitempty"`
	// Group is a tenant group's name.
	Group string `json:"group,omitempty"`
	// Reason (drain) says why, as Slurm's Reason= does: recorded with
	// who drained and when, and shown in status until the resume. A drain
	// without one records "no reason given".
	Reason string `json:"reason,omitempty"`
}

// MaxReasonBytes bounds AdminTarget.Reason.
const MaxReasonBytes = 256

// Validate checks that the target names something and that the reason is
// one printable line.
func (t AdminTarget) Validate() error {
	if t.GPU == "" && t.Group == "" {
		return fmt.Errorf("%w: name a gpu, a group or both", ErrInvalid)
	}
	if len(t.GPU) > 128 || len(t.Group) > 128 {
		return fmt.Errorf("%w: gpu or group longer than 128 bytes", ErrInvalid)
	}
	if err := validReason(t.Reason); err != nil {
		return err
	}
	return nil
}

// unprintable: a control character, or a format one (bidirectional
// overrides and other invisible characters that would make a table or a
// log line read otherwise than it is).
func unprintable(c rune) bool { return unicode.IsControl(c) || unicode.Is(unicode.Cf, c) }

// validReason checks an operator's reason: at most MaxReasonBytes of
// valid UTF-8, one line, no control characters (it is shown in tables and
// logs).
func validReason(r string) error {
	switch {
	case len(r) > MaxReasonBytes:
		return fmt.Errorf("%w: reason longer than %d bytes", ErrInvalid, MaxReasonBytes)
	case !utf8.ValidString(r):
		return fmt.Errorf("%w: reason is not valid UTF-8", ErrInvalid)
	case strings.IndexFunc(r, unprintable) >= 0:
		return fmt.Errorf("%w: reason has a control or format character (one line, printable)", ErrInvalid)
	}
	return nil
}

// AdminResult answers an admin command: the instances it changed, each
// with its state afterwards.
type AdminResult struct {
	Instances []InstanceStatus `json:"instances"`
	// Lifted (resume) says, for each of Instances in the same order, what
	// the resume lifted.
	Lifted []Lifted `json:"lifted,omitempty"`
	// Already (drain) says, for each of Instances in the same order,
	// whether it was drained before this request (which then changed
	// nothing but, with a new reason, the reason).
	Already []bool `json:"already,omitempty"`
}

// Lifted is what a resume lifted from one instance: a drain, a
// quarantine (and why it had been quarantined), both or nothing.
type Lifted struct {
	Drain      bool `json:"drain,omitempty"`
	Quarantine bool `json:"quarantine,omitempty"`
	// QuarantineReason is the lifted quarantine's InstanceStatus reason.
	QuarantineReason string `json:"quarantine_reason,omitempty"`
}

// ReleaseRequest is the body of POST /v1/leases/{id}/release.
type ReleaseRequest struct {
	// Attempt is the run whose command ended, the attempt of the grant it
	// ran under: a lease at a later attempt (its run was revoked and
	// requeued meanwhile) is not released (409, CodeRevoking: the stream
	// says how it goes on). 0, from a client older than the field, is not
	// checked.
	Attempt int `json:"attempt,omitempty"`
	// ExitStatus is the command's exit status as mps-launch exits with
	// it (0 to 255; 128+N when signal N killed it, Signal naming it), for
	// the history (HistoryRecord). Absent, from a client older than the
	// fields: unknown.
	ExitStatus *int   `json:"exit_status,omitempty"`
	Signal     string `json:"signal,omitempty"`
}

// maxSignalLen bounds ReleaseRequest.Signal ("SIGRTMIN+15" and shorter).
const maxSignalLen = 16

// Validate checks the attempt, the exit status and the signal's name.
func (q ReleaseRequest) Validate() error {
	if q.Attempt < 0 {
		return fmt.Errorf("%w: release: attempt %d", ErrInvalid, q.Attempt)
	}
	if q.ExitStatus != nil && (*q.ExitStatus < 0 || *q.ExitStatus > 255) {
		return fmt.Errorf("%w: release: exit_status %d: want 0 to 255", ErrInvalid, *q.ExitStatus)
	}
	if q.Signal != "" && (q.ExitStatus == nil || len(q.Signal) > maxSignalLen || strings.Trim(q.Signal, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+") != "") {
		return fmt.Errorf("%w: release: signal %q: want a signal's name (SIGKILL) with an exit_status", ErrInvalid, q.Signal)
	}
	return nil
}

// ShutdownRequest is the body of PathShutdown, an empty object today.
type ShutdownRequest struct{}

// ShutdownResult answers PathShutdown once the workloads are ended, the
// MPS daemons stopped and the compute modes restored; mpsd exits after
// sending it.
type ShutdownResult struct {
	// Revoked is the number of running leases revoked, Withdrawn of
	// queued requests refused; their launchers were told why.
	Revoked   int `json:"revoked"`
	Withdrawn int `json:"withdrawn"`
	// Daemons is the number of MPS control daemons stopped.
	Daemons int `json:"daemons"`
	// Problems lists what did not go cleanly (a daemon that had to be
	// killed, a compute mode not restored), one line each.
	Problems []string `json:"problems,omitempty"`
}

// RequeueRequest is the body of PathRequeue.
type RequeueRequest struct {
	Lease string `json:"lease"`
}

// Validate checks the lease id.
func (r RequeueRequest) Validate() error {
	if err := ValidLeaseID(r.Lease); err != nil {
		return fmt.Errorf("%w: lease: %w", ErrInvalid, err)
	}
	return nil
}

// InjectXidRequest is the body of PathInjectXid.
type InjectXidRequest struct {
	// GPU is the NVML index of the simulated GPU.
	GPU int `json:"gpu"`
	// Xid is the error number, e.g. 79 (fallen off the bus) or 13 (an
	// application's illegal access).
	Xid uint64 `json:"xid"`
	// PID names the faulting process; 0 when unknown.
	PID int `json:"pid,omitempty"`
}

// Validate checks the ranges.
func (r InjectXidRequest) Validate() error {
	var bad []string
	if r.GPU < 0 || r.GPU > 1023 {
		bad = append(bad, fmt.Sprintf("gpu %d is not a GPU index", r.GPU))
	}
	if r.Xid == 0 || r.Xid > 1<<16 {
		bad = append(bad, fmt.Sprintf("xid %d is out of range 1-65536", r.Xid))
	}
	if r.PID < 0 {
		bad = append(bad, fmt.Sprintf("pid %d is negative", r.PID))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(bad, "; "))
	}
	return nil
}
