package mpsctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/policy"
)

// command is one mpsctl command. Adding one is adding an entry to
// commands: its synopsis and summary feed the usage text, setup defines
// its flags and returns what runs it.
type command struct {
	name string
	// args is the synopsis after the name: "--gpu SEL | --group NAME".
	args string
	// summary is one line for the command list; long, when set, is the
	// paragraph of `mpsctl help NAME`.
	summary, long string
	// daemon says the command talks to mpsd: it accepts --socket after
	// its name too, and inv.client() reaches the socket chosen.
	daemon bool
	// level is the API level of the newest thing the command uses (0:
	// api.LevelBase); mpsctl warns once when mpsd serves a lower one.
	level int
	// setup defines the command's flags on fs (mpsctl parses them, and
	// --socket for daemon commands, wherever they appear among the
	// arguments) and returns the function that runs the command with the
	// positional arguments left. A usage problem it finds is returned as
	// usagef(...).
	setup func(fs *flag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, inv *invocation, args []string) error

// commands is the command table, in the order of the usage text.
// An admin command over an AdminTarget is one adminCommand entry; one
// with positional arguments parses them in its runFunc and calls
// inv.client().Post.
var commands = []command{
	{
		name:    "status",
		args:    "[FILTERS] [-o FORMAT]",
		summary: "show instances, leases and queues",
		long:    statusLong,
		daemon:  true,
		setup:   statusCommand,
	},
	{
		name:    "drain",
		args:    "--gpu SEL | --group NAME [--reason TEXT]",
		summary: "close instances to new leases; running ones go on",
		long: "Closes the instances of a GPU (index, UUID or UUID prefix), of a group, or\n" +
			"of that group on that GPU to new leases; running leases go on. --reason says\n" +
			"why (\"no reason given\" without it): it is recorded with who drained and\n" +
			"when, kept across restarts of mpsd, and shown in status until the resume,\n" +
			"as Slurm's Reason= is. A drained instance reads draining\n" +
			"while leases run on it and drained once it is empty (its GPU is then safe\n" +
			"to reset). Draining a drained instance changes nothing but, with another\n" +
			"reason, the reason, and says since when it was drained. Admins only.",
		daemon: true,
		setup:  drainCommand,
	},
	adminCommand("resume", api.PathResume, "resumed",
		"reopen drained or quarantined instances",
		"Reopens the drained or quarantined instances of a GPU, of a group, or of\n"+
			"that group on that GPU: it lifts a drain and a quarantine alike (--gpu all\n"+
			"lifts every one), and says per instance what it lifted. Admins only."),
	adminCommand("restart", api.PathRestart, "restarting",
		"restart instances, requeueing their leases",
		"Restarts the MPS control daemons of the instances of a GPU (index, UUID or\n"+
			"UUID prefix), of a group, or of that group on that GPU. Their running leases\n"+
			"are revoked and requeued, as after a fault. Admins only."),
	{
		name:    "requeue",
		args:    "LEASE",
		summary: "revoke a running lease and queue it again",
		long: "Revokes the running lease LEASE (an ID as mpsctl status lists it) and puts\n" +
			"it back at the head of its group's queue, as a fault on its instance would:\n" +
			"its processes are stopped and its command runs again when it is granted.\n" +
			"Admins only.",
		daemon: true,
		setup:  requeueCommand,
	},
	{
		name:    "cancel",
		args:    "[--signal SIG [--grace D]] LEASE...",
		summary: "end leases for good, running or queued; no requeue",
		long: "Ends each LEASE (an ID as mpsctl status lists it) for good: a queued one\n" +
			"leaves its queue, a running one has its command stopped and is not requeued.\n" +
			"Its mps-launch exits 122 and prints who cancelled it. --signal sends SIG to\n" +
			"the command's processes first and gives them --grace (default 10s) to end\n" +
			"before what is left is killed. The lease's owner or an admin.",
		daemon: true,
		level:  api.LevelOperatorView,
		setup:  cancelCommand,
	},
	{
		name:    "history",
		args:    "[--since D] [--user U] [--group G] [--json]",
		summary: "show ended leases, how each ended and its exit status",
		long: "Shows the leases that have ended, oldest first, from mpsd's history file:\n" +
			"who ran them where, with what share, how long they waited and ran, how they\n" +
			"ended (released, withdrawn, exhausted, shutdown, ...), the command's exit\n" +
			"status and the most device memory they held. --since D keeps those that\n" +
			"ended in the last D (2h) or since D (an RFC 3339 time); --user a name or\n" +
			"uid; --group a group. Admins see every user's; anyone else their own.\n" +
			"--json prints the history document as mpsd sent it.",
		daemon: true,
		level:  api.LevelOperatorView,
		setup:  historyCommand,
	},
	{
		name:    "shutdown",
		args:    "",
		summary: "end the leases, stop MPS and restore compute modes, then stop mpsd",
		long: "Shuts the host's MPS service down, where SIGTERM stops mpsd only: nothing\n" +
			"more is granted, queued requests are refused, running leases are revoked\n" +
			"(their commands stopped, not requeued: mps-launch exits 75 and says why),\n" +
			"the MPS control daemons quit, the GPUs' compute modes are restored, then\n" +
			"mpsd removes its socket (unless systemd holds it) and exits: a later\n" +
			"mps-launch fails at once (125) instead of waiting for mpsd. Admins only.",
		daemon: true,
		setup:  shutdownCommand,
	},
	{
		name:    "inject-xid",
		args:    "GPU XID [--pid PID]",
		summary: "raise a simulated Xid (mpsd --simulate only)",
		long: "Raises Xid XID (1-65536) on GPU (an NVML index) as if the driver had\n" +
			"reported it, to try mpsd's fault handling: e.g. 79 (fallen off the bus), or\n" +
			"13 (an application's illegal access) with --pid naming the process. Works\n" +
			"only against mpsd --simulate; an mpsd on real GPUs refuses it. Admins only.",
		daemon: true,
		setup:  injectXidCommand,
	},
	{
		name:    "version",
		args:    "",
		summary: "show mpsctl's version and mpsd's",
		long: "Prints mpsctl's version line (as --version does), then mpsd's: its version,\n" +
			"commit, Go version and the API level it serves. When mpsd cannot be reached\n" +
			"or does not say, mpsctl's line is printed all the same, and the reason on\n" +
			"stderr (exit 1).",
		daemon: true,
		level:  api.LevelOperatorView,
		setup:  versionCommand,
	},
	{
		name:    "check-config",
		args:    "[--simulate] FILE",
		summary: "check a config file (no mpsd needed)",
		long: "Checks FILE as mpsd would load it on this host: every problem is printed on\n" +
			"stderr, one per line with its key path. GPU selectors and memory budgets are\n" +
			"checked against this host's GPUs (NVML); without NVML those checks are\n" +
			"skipped, with a note. --simulate checks them against the GPUs of the\n" +
			"config's simulate: section instead, as mpsd --simulate would.",
		setup: checkConfigCommand,
	},
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// adminCommand is a command that posts an api.AdminTarget (--gpu,
// --group or both) to path and prints the instances changed, "<verb> gpu
// ...".
func adminCommand(name, path, verb, summary, long string) command {
	return command{
		name:    name,
		args:    "--gpu SEL | --group NAME",
		summary: summary,
		long:    long,
		daemon:  true,
		setup: func(fs *flag.FlagSet) runFunc {
			var t api.AdminTarget
			fs.StringVar(&t.GPU, "gpu", "", "`SEL` names the GPU: an index, a UUID or a UUID prefix")
			fs.StringVar(&t.Group, "group", "", "`NAME` names the tenant group")
			return func(ctx context.Context, inv *invocation, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if t.GPU == "" && t.Group == "" {
					return usagef("name --gpu, --group or both")
				}
				if err := t.Validate(); err != nil { // what mpsd would refuse
					return usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": "))
				}
				res, err := inv.client().Admin(ctx, path, t)
				if err != nil {
					return err
				}
				if path == api.PathResume {
					return WriteResumeResult(inv.stdout, res)
				}
				return WriteAdminResult(inv.stdout, verb, res)
			}
		},
	}
}

func requeueCommand(*flag.FlagSet) runFunc {
	return func(ctx context.Context, inv *invocation, args []string) error {
		switch {
		case len(args) == 0:
			return usagef("missing LEASE")
		case len(args) > 1:
			return usagef("unexpected argument %q", args[1])
		}
		lease := args[0]
		if err := api.ValidLeaseID(lease); err != nil {
			return usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": "))
		}
		var res api.AdminResult
		if _, err := inv.client().Post(ctx, api.PathRequeue, api.RequeueRequest{Lease: lease}, &res); err != nil {
			return err
		}
		return WriteRequeueResult(inv.stdout, lease, res)
	}
}

func shutdownCommand(*flag.FlagSet) runFunc {
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		res, err := inv.client().Shutdown(ctx)
		if err != nil {
			return err
		}
		return WriteShutdownResult(inv.stdout, res)
	}
}

// Bounds of inject-xid's arguments, as api.InjectXidRequest.Validate
// checks them.
const (
	maxGPUIndex = 1023
	maxXid      = 1 << 16
)

func injectXidCommand(fs *flag.FlagSet) runFunc {
	var pid pidFlag
	fs.Var(&pid, "pid", "`PID` names the faulting process (default: none)")
	return func(ctx context.Context, inv *invocation, args []string) error {
		switch {
		case len(args) == 0:
			return usagef("missing GPU and XID")
		case len(args) == 1:
			return usagef("missing XID")
		case len(args) > 2:
			return usagef("unexpected argument %q", args[2])
		}
		gpuIdx, err := strconv.ParseUint(args[0], 10, 64)
		if err != nil || gpuIdx > maxGPUIndex {
			return usagef("GPU %q is not a GPU index (0-%d)", args[0], maxGPUIndex)
		}
		xid, err := strconv.ParseUint(args[1], 10, 64)
		if err != nil || xid == 0 || xid > maxXid {
			return usagef("XID %q is not an Xid (1-%d)", args[1], maxXid)
		}
		req := api.InjectXidRequest{GPU: int(gpuIdx), Xid: xid, PID: pid.pid}
		if err := req.Validate(); err != nil { // what mpsd would refuse
			return usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": "))
		}
		var answer struct{} // {}: any JSON object will do
		if _, err := inv.client().Post(ctx, api.PathInjectXid, req, &answer); err != nil {
			return err
		}
		msg := fmt.Sprintf("injected Xid %d on gpu %d", req.Xid, req.GPU)
		if req.PID != 0 {
			msg += fmt.Sprintf(" for pid %d", req.PID)
		}
		_, err = fmt.Fprintln(inv.stdout, msg)
		return err
	}
}

// pidFlag is inject-xid's --pid: a positive process id.
type pidFlag struct{ pid int }

func (p *pidFlag) String() string {
	if p == nil || p.pid == 0 {
		return ""
	}
	return strconv.Itoa(p.pid)
}

func (p *pidFlag) Set(v string) error {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n <= 0 {
		return errors.New("not a process id")
	}
	p.pid = int(n)
	return nil
}

func checkConfigCommand(fs *flag.FlagSet) runFunc {
	simulate := fs.Bool("simulate", false, "check against the GPUs of the config's simulate: section")
	return func(_ context.Context, inv *invocation, args []string) error {
		switch {
		case len(args) == 0:
			return usagef("missing FILE")
		case len(args) > 1:
			return usagef("unexpected argument %q", args[1])
		}
		return checkConfig(inv, args[0], *simulate)
	}
}

// checkConfig checks the config file at path against the GPUs and the
// driver of this host (or of its simulate section) and prints "FILE: ok"
// or its problems.
func checkConfig(inv *invocation, path string, simulate bool) error {
	var (
		gpus   []policy.GPU
		driver string
	)
	if simulate {
		cfg, err := policy.LoadFile(path, policy.Host{})
		if err != nil {
			return inv.configProblems(path, err)
		}
		sim, err := gpu.NewSim(gpu.SimSpec{GPUs: cfg.Simulate.GPUs, Model: cfg.Simulate.Model})
		if err != nil {
			fmt.Fprintf(inv.stderr, "%s: simulate: %v\n", path, err)
			return errReported
		}
		if gpus, driver, err = hostGPUs(sim.NVML()); err != nil {
			return fmt.Errorf("simulated GPUs: %w", err)
		}
	} else {
		var err error
		gpus, driver, err = hostGPUs(inv.nvml())
		switch {
		case errors.Is(err, gpu.ErrNVMLUnavailable):
			fmt.Fprintf(inv.stderr, "mpsctl: note: GPU checks skipped (GPU selectors, memory budgets against the cards, multiuser against the driver): %v\n", err)
			gpus = nil
		case err != nil:
			return fmt.Errorf("read this host's GPUs: %w", err)
		}
	}
	cfg, err := policy.LoadFile(path, policy.Host{GPUs: gpus, Driver: driver})
	if err != nil {
		return inv.configProblems(path, err)
	}
	// The directories as they are on this host: mpsd refuses to start on
	// ones that someone but root could change.
	if err := policy.CheckDirs(cfg, os.Geteuid()); err != nil {
		return inv.configProblems(path, err)
	}
	_, err = fmt.Fprintf(inv.stdout, "%s: ok\n", path)
	return err
}

// configProblems prints every problem of a *policy.ConfigError on stderr,
// "FILE: key: message", and returns errReported; other errors (the file
// cannot be read) are returned as they are.
func (inv *invocation) configProblems(path string, err error) error {
	var ce *policy.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	for _, p := range ce.Problems {
		fmt.Fprintf(inv.stderr, "%s: %s\n", path, p)
	}
	if len(ce.Problems) == 0 {
		fmt.Fprintf(inv.stderr, "%s: invalid\n", path)
	}
	return errReported
}

// hostGPUs reads the GPU inventory through lib as policy needs it (a
// non-nil slice, empty on a host without GPUs) and the driver's version
// ("" when NVML does not say).
func hostGPUs(lib nvml.Interface) (_ []policy.GPU, driver string, err error) {
	h, err := gpu.New(lib, nil)
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if cerr := h.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	infos := h.GPUs()
	out := make([]policy.GPU, 0, len(infos))
	for _, in := range infos {
		out = append(out, policy.GPU{
			Index:  in.Index,
			UUID:   in.UUID,
			Memory: int64(min(in.MemoryTotalBytes, math.MaxInt64)),
		})
	}
	return out, h.DriverVersion(), nil
}
