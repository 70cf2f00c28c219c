package mps

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/internal/units"
)

// Typed commands. Each takes a ctx whose end kills the client process and
// returns ErrTimeout; errors are *CommandError values (see Command).

// silent runs a command that prints nothing on success.
func (d *Daemon) silent(ctx context.Context, line string) error {
	out, err := d.Command(ctx, line)
	if err != nil {
		return err
	}
	if len(outputLines(out)) != 0 {
		return &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: out, Err: ErrUnexpectedOutput}
	}
	return nil
}

// parsed runs a command and parses its output, wrapping parse errors.
func parsed[T any](ctx context.Context, d *Daemon, line string, parse func(string) (T, error)) (T, error) {
	out, err := d.Command(ctx, line)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := parse(out)
	if err != nil {
		return v, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: out, Err: err}
	}
	return v, nil
}

// ServerList returns the pids of the daemon's servers (get_server_list).
// Servers not seen before are watched (and reported as ServerStarted)
// once verified through a pidfd (child of the daemon running
// nvidia-cuda-mps-server); a pid that is not is reported as UnverifiedRecord.
func (d *Daemon) ServerList(ctx context.Context) ([]int, error) {
	pids, err := parsed(ctx, d, "get_server_list", parsePIDList)
	if err != nil {
		return nil, err
	}
	for _, pid := range pids {
		d.serverSeen(pid, time.Now(), SourceCommand, "get_server_list: "+strconv.Itoa(pid))
	}
	return pids, nil
}

// ServerStatus returns a server's state. On daemons without
// get_server_status (535) it is inferred: not in get_server_list ->
// ErrServerNotFound; logged "NEW SERVER <pid>: Ready" -> StateActive; else
// StateInitializing (FAULT cannot be inferred there).
func (d *Daemon) ServerStatus(ctx context.Context, pid int) (ServerState, error) {
	if d.caps.ServerStatus {
		st, err := parsed(ctx, d, "get_server_status "+strconv.Itoa(pid), parseServerState)
		if !errors.Is(err, ErrUnknownCommand) {
			return st, err
		}
	}
	pids, err := d.ServerList(ctx)
	if err != nil {
		return StateUnknown, err
	}
	if !slices.Contains(pids, pid) {
		return StateUnknown, &CommandError{Command: "get_server_list", PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: %d", ErrServerNotFound, pid)}
	}
	d.mu.Lock()
	ready := d.ready[pid]
	d.mu.Unlock()
	if ready {
		return StateActive, nil
	}
	return StateInitializing, nil
}

// ReportedServerStatus is a server's state as the daemon's
// get_server_status reports it, never inferred: ErrUnknownCommand on a
// daemon without the command (535), which cannot tell FAULT.
func (d *Daemon) ReportedServerStatus(ctx context.Context, pid int) (ServerState, error) {
	return parsed(ctx, d, "get_server_status "+strconv.Itoa(pid), parseServerState)
}

// StartServer asks the daemon to start a server for uid (start_server
// -uid). A server for that uid already running: no-op; for another uid: the
// daemon queues it until that server exits.
func (d *Daemon) StartServer(ctx context.Context, uid int) error {
	if uid < 0 {
		return &CommandError{Command: "start_server", PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: uid %d", ErrInvalidValue, uid)}
	}
	return d.silent(ctx, "start_server -uid "+strconv.Itoa(uid))
}

// ShutdownServer asks a server to exit (shutdown_server): after its clients
// leave, or at once with force (SIGINT only; the daemon never escalates).
func (d *Daemon) ShutdownServer(ctx context.Context, pid int, force bool) error {
	line := "shutdown_server " + strconv.Itoa(pid)
	if force {
		line += " -f"
	}
	return d.silent(ctx, line)
}

// ClientList returns the pids of a server's clients (get_client_list).
func (d *Daemon) ClientList(ctx context.Context, serverPID int) ([]int, error) {
	return parsed(ctx, d, "get_client_list "+strconv.Itoa(serverPID), parsePIDList)
}

// TerminateClient terminates a client of a server (terminate_client). It
// blocks until done; a non-zero CUDA result is returned as *CUDAError.
func (d *Daemon) TerminateClient(ctx context.Context, serverPID, clientPID int) error {
	line := fmt.Sprintf("terminate_client %d %d", serverPID, clientPID)
	code, err := parsed(ctx, d, line, parseInt)
	if err != nil {
		return err
	}
	if code != 0 {
		return &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: strconv.Itoa(code), Err: &CUDAError{Code: code}}
	}
	return nil
}

// setPercent sends a percentage and checks the echo: the daemon answers
// invalid input with its unchanged old value.
func (d *Daemon) setPercent(ctx context.Context, line string, p float64) (float64, error) {
	got, err := parsed(ctx, d, line, parsePercent)
	if err != nil {
		return got, err
	}
	if !SamePercent(got, p) {
		return got, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: strconv.FormatFloat(got, 'f', 1, 64), Err: fmt.Errorf("%w: daemon kept %.1f", ErrInvalidValue, got)}
	}
	return got, nil
}

func formatPercent(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) }

// SetDefaultActiveThreadPercentage sets the thread percentage of future
// servers and returns the value the daemon now holds. A value the daemon
// rejects returns ErrInvalidValue with the unchanged old value.
func (d *Daemon) SetDefaultActiveThreadPercentage(ctx context.Context, p float64) (float64, error) {
	return d.setPercent(ctx, "set_default_active_thread_percentage "+formatPercent(p), p)
}

// DefaultActiveThreadPercentage returns the default thread percentage.
func (d *Daemon) DefaultActiveThreadPercentage(ctx context.Context) (float64, error) {
	return parsed(ctx, d, "get_default_active_thread_percentage", parsePercent)
}

// notReady maps the empty answer of a per-server query (the server is still
// initializing) to ErrServerNotReady.
func notReady[T any](ctx context.Context, d *Daemon, line string, parse func(string) (T, error)) (T, error) {
	out, err := d.Command(ctx, line)
	if err != nil {
		var zero T
		return zero, err
	}
	if len(outputLines(out)) == 0 {
		var zero T
		return zero, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Err: ErrServerNotReady}
	}
	v, err := parse(out)
	if err != nil {
		return v, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: out, Err: err}
	}
	return v, nil
}

// SetActiveThreadPercentage sets a running server's thread percentage.
func (d *Daemon) SetActiveThreadPercentage(ctx context.Context, serverPID int, p float64) (float64, error) {
	line := fmt.Sprintf("set_active_thread_percentage %d %s", serverPID, formatPercent(p))
	got, err := notReady(ctx, d, line, parsePercent)
	if err != nil {
		return got, err
	}
	if !SamePercent(got, p) {
		return got, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: server kept %.1f", ErrInvalidValue, got)}
	}
	return got, nil
}

// ActiveThreadPercentage returns a running server's thread percentage;
// ErrServerNotReady while it initializes.
func (d *Daemon) ActiveThreadPercentage(ctx context.Context, serverPID int) (float64, error) {
	return notReady(ctx, d, "get_active_thread_percentage "+strconv.Itoa(serverPID), parsePercent)
}

// memValue renders a limit as whole MiB ("8192M"), the only form MPS reads
// unambiguously (it takes any suffix but G as MiB).
func memValue(dev int, bytes int64) (string, error) {
	if dev < 0 {
		return "", fmt.Errorf("%w: device ordinal %d", ErrInvalidValue, dev)
	}
	v, err := units.MPSLimit(bytes)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidValue, err)
	}
	return v, nil
}

// SetDefaultDevicePinnedMemLimit sets the default pinned device memory limit
// of future servers for device ordinal dev, sent as whole MiB (rounded down).
func (d *Daemon) SetDefaultDevicePinnedMemLimit(ctx context.Context, dev int, bytes int64) error {
	v, err := memValue(dev, bytes)
	if err != nil {
		return &CommandError{Command: "set_default_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Err: err}
	}
	return d.silent(ctx, fmt.Sprintf("set_default_device_pinned_mem_limit %d %s", dev, v))
}

// DefaultDevicePinnedMemLimit returns the default limit of device dev in
// bytes as the daemon reports it (whole GiB floored when >= 1 GiB); ok is
// false when none is set.
func (d *Daemon) DefaultDevicePinnedMemLimit(ctx context.Context, dev int) (bytes int64, ok bool, err error) {
	out, err := d.Command(ctx, "get_default_device_pinned_mem_limit "+strconv.Itoa(dev))
	if err != nil {
		return 0, false, err
	}
	bytes, ok, err = parseMemLimit(out)
	if err != nil {
		return 0, false, &CommandError{Command: "get_default_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Output: out, Err: err}
	}
	return bytes, ok, nil
}

// SetDevicePinnedMemLimit sets a running server's pinned memory limit on
// device dev.
func (d *Daemon) SetDevicePinnedMemLimit(ctx context.Context, serverPID, dev int, bytes int64) error {
	v, err := memValue(dev, bytes)
	if err != nil {
		return &CommandError{Command: "set_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Err: err}
	}
	return d.silent(ctx, fmt.Sprintf("set_device_pinned_mem_limit %d %d %s", serverPID, dev, v))
}

// DevicePinnedMemLimit returns a running server's limit on device dev; ok is
// false when none is set.
func (d *Daemon) DevicePinnedMemLimit(ctx context.Context, serverPID, dev int) (bytes int64, ok bool, err error) {
	line := fmt.Sprintf("get_device_pinned_mem_limit %d %d", serverPID, dev)
	out, err := d.Command(ctx, line)
	if err != nil {
		return 0, false, err
	}
	bytes, ok, err = parseMemLimit(out)
	if err != nil {
		return 0, false, &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: out, Err: err}
	}
	return bytes, ok, nil
}

// SetDefaultClientPriority sets the default client priority (0 normal, 1 below normal).
func (d *Daemon) SetDefaultClientPriority(ctx context.Context, prio int) error {
	line := "set_default_client_priority " + strconv.Itoa(prio)
	if prio != 0 && prio != 1 {
		return &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: priority %d (0 or 1)", ErrInvalidValue, prio)}
	}
	return d.silent(ctx, line)
}

// DefaultClientPriority returns the default client priority.
func (d *Daemon) DefaultClientPriority(ctx context.Context) (int, error) {
	return parsed(ctx, d, "get_default_client_priority", parseInt)
}

// ServerCaps is a running server's limits as the daemon reports them: its
// thread percentage and, per device ordinal of the server, its pinned
// memory limit in bytes (0: none set; one of 1 GiB or more floored to
// whole GiB, as the daemon prints it).
type ServerCaps struct {
	ThreadPercentage float64
	PinnedMem        []int64
}

// ReportedPinnedMem is what the daemon reports of a pinned memory limit of
// b bytes set through this package: whole GiB (floored) from 1 GiB on,
// else whole MiB.
func ReportedPinnedMem(b int64) int64 {
	if b >= units.GiB {
		return b / units.GiB * units.GiB
	}
	return b / units.MiB * units.MiB
}

// ServerCaps reads a running server's thread percentage and the pinned
// memory limits of its devices 0..devices-1 with one call of the control
// program (get_active_thread_percentage, get_device_pinned_mem_limit),
// falling back to one call per device when a device has no limit (the
// daemon then prints nothing for it). ErrServerNotReady while the server
// initializes (the daemon prints nothing), ErrServerNotFound for a server
// the daemon does not know.
func (d *Daemon) ServerCaps(ctx context.Context, serverPID, devices int) (ServerCaps, error) {
	if devices < 1 || devices > maxServerDevices {
		return ServerCaps{}, &CommandError{Command: "get_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: %d devices", ErrInvalidValue, devices)}
	}
	lines := []string{"get_active_thread_percentage " + strconv.Itoa(serverPID)}
	for dev := range devices {
		lines = append(lines, fmt.Sprintf("get_device_pinned_mem_limit %d %d", serverPID, dev))
	}
	out, err := d.commands(ctx, lines...)
	if err != nil {
		return ServerCaps{}, err
	}
	got := outputLines(out)
	if len(got) == 0 {
		return ServerCaps{}, &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Err: ErrServerNotReady}
	}
	if len(got) > len(lines) {
		return ServerCaps{}, &CommandError{Command: strings.Join(lines, "; "), PipeDir: d.cfg.PipeDir, Output: out, Err: ErrUnexpectedOutput}
	}
	p, err := parsePercent(got[0])
	if err != nil {
		return ServerCaps{}, &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Output: out, Err: err}
	}
	caps := ServerCaps{ThreadPercentage: p, PinnedMem: make([]int64, devices)}
	if len(got) == len(lines) {
		for i, l := range got[1:] {
			b, _, err := parseMemLimit(l)
			if err != nil {
				return ServerCaps{}, &CommandError{Command: lines[i+1], PipeDir: d.cfg.PipeDir, Output: out, Err: err}
			}
			caps.PinnedMem[i] = b
		}
		return caps, nil
	}
	// A device without a limit answered nothing: which one, only a call
	// per device says.
	for dev := range devices {
		b, _, err := d.DevicePinnedMemLimit(ctx, serverPID, dev)
		if err != nil {
			return ServerCaps{}, err
		}
		caps.PinnedMem[dev] = b
	}
	return caps, nil
}

// maxServerDevices bounds the devices of one server a call names.
const maxServerDevices = 64

// SetServerCaps sets a running server's thread percentage and the pinned
// memory limit of each of its devices (memBytes[dev], sent as whole MiB)
// with one call of the control program, then reads them back (ServerCaps)
// and returns what the server now holds. ErrInvalidValue when it holds
// other values than those set (the daemon refused one); the per-server
// errors of ServerCaps otherwise. Setting on a server that still
// initializes changes nothing (the daemon prints nothing): that read-back
// says ErrServerNotReady.
func (d *Daemon) SetServerCaps(ctx context.Context, serverPID int, p float64, memBytes []int64) (ServerCaps, error) {
	if math.IsNaN(p) || !(p > 0 && p <= 100) || len(memBytes) < 1 || len(memBytes) > maxServerDevices {
		return ServerCaps{}, &CommandError{Command: "set_active_thread_percentage", PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: %v%% on %d devices", ErrInvalidValue, p, len(memBytes))}
	}
	lines := []string{fmt.Sprintf("set_active_thread_percentage %d %s", serverPID, formatPercent(p))}
	for dev, b := range memBytes {
		v, err := memValue(dev, b)
		if err != nil {
			return ServerCaps{}, &CommandError{Command: "set_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Err: err}
		}
		lines = append(lines, fmt.Sprintf("set_device_pinned_mem_limit %d %d %s", serverPID, dev, v))
	}
	if _, err := d.commands(ctx, lines...); err != nil {
		return ServerCaps{}, err
	}
	caps, err := d.ServerCaps(ctx, serverPID, len(memBytes))
	if err != nil {
		return caps, err
	}
	if !SamePercent(caps.ThreadPercentage, p) {
		return caps, &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: server kept %.1f%%", ErrInvalidValue, caps.ThreadPercentage)}
	}
	for dev, b := range memBytes {
		if caps.PinnedMem[dev] != ReportedPinnedMem(b) {
			return caps, &CommandError{Command: lines[dev+1], PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: server kept %d bytes", ErrInvalidValue, caps.PinnedMem[dev])}
		}
	}
	return caps, nil
}
