package launcher

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/cli"
	"github.com/mpsd/mpsd/internal/gpusel"
	"github.com/mpsd/mpsd/internal/units"
)

// usageSynopsis is mps-launch's command line, as its usage and
// mps-launch(1) show it.
const usageSynopsis = `mps-launch [--sm PCT] [--mem SIZE] [--gpus N] [--gpu LIST] [--group NAME]
                  [--procs N] [--requeue N|--no-requeue] [--wait DURATION|--no-wait]
                  [--job ID] [--no-slurm] [--socket PATH] [--quiet]
                  -- COMMAND [ARG...]`

// usageAbout says what mps-launch does, before the flags.
const usageAbout = "Runs COMMAND on a GPU shared through CUDA MPS, under a lease from mpsd."

// usageSlurm is what a Slurm job's environment changes.
const usageSlurm = `Inside a Slurm job ($SLURM_JOB_ID set) the job's allocation gives the
defaults: --job $SLURM_JOB_ID.$SLURM_STEP_ID (.STEP only in a step), --sm
$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (gres/mps), --gpu $SLURM_STEP_GPUS, else
$SLURM_JOB_GPUS, else $CUDA_VISIBLE_DEVICES. Flags override them.
COMMAND's CUDA_VISIBLE_DEVICES names the lease's GPUs by UUID; the lease's
MPS variables replace the caller's (mps-launch says which it ignored).
mps-launch refuses to run as another user than $SLURM_JOB_UID.`

// usageExit lists the exit statuses (ExitCode's).
const usageExit = `COMMAND's; 128+N if it died by signal N; 125 launcher or mpsd
error, or no mpsd at the socket and none restarting; 126 COMMAND not
executable; 127 COMMAND not found; 75 wait timed out, requeue attempts used
up, mpsctl shutdown ended the lease, or mpsd unreachable for a minute
(slurm.conf RequeueExit=75 requeues the job); 122 mpsctl cancel ended the
lease (not to be requeued).`

// usageWaits says how mps-launch waits.
const usageWaits = `While mpsd restarts, mps-launch waits for it, keeping its lease or its place
in the queue. While queued it says where and why on stderr: one live line on
a terminal; elsewhere (a batch job's log) a line when the wait begins, one
when mpsd's reason changes and one at the grant, with the time waited.`

// launcherFlag is one of mps-launch's flags. flagTable is the one list of
// them: ParseArgs's check of a flag's name and whether it takes a value,
// the "did you mean" of a mistyped one, the usage text, mps-launch(1)
// and the completion scripts all read it.
type launcherFlag struct {
	// name is without dashes: "sm", "no-wait".
	name string
	// arg is the value's placeholder ("PCT"); "" for a flag that takes
	// none.
	arg string
	// usage is one line on what the flag does (Usage wraps it).
	usage string
	// short is the one-letter name that works too ("h" for help).
	short string
}

// flagTable is in the order of the usage text.
var flagTable = []launcherFlag{
	{name: "sm", arg: "PCT", usage: "percent of each GPU's SMs, 1-100 (default: the group's)"},
	{name: "mem", arg: "SIZE", usage: "pinned device memory per GPU: 8G, 8GiB, 512M, 1.5G, bytes; units are binary (default: the group's)"},
	{name: "gpus", arg: "N", usage: "number of GPUs: the group's instance size (the default; any other number is refused with the size)"},
	{name: "gpu", arg: "LIST", usage: "run only on these GPUs: NVML indexes, GPU UUIDs or UUID prefixes, comma-separated (default: any of the group's)"},
	{name: "group", arg: "NAME", usage: "tenant group (default: your only group, or the one the config names as your default; needed otherwise)"},
	{name: "procs", arg: "N", usage: "COMMAND runs N CUDA processes (a server's workers), 1-" + strconv.Itoa(api.MaxProcs) + ": each gets --sm divided by N, rounded down (at most --sm processes), so together they keep to --sm; each may use --mem, and mpsd holds their sum to --mem (default 1)"},
	{name: "requeue", arg: "N", usage: "relaunch at most N times if a fault revokes the lease (default: the group's requeue_attempts)"},
	{name: "no-requeue", usage: "never relaunch"},
	{name: "wait", arg: "DURATION", usage: "give up after waiting this long in the queue, or for an mpsd that does not answer (e.g. 90s, 5m; default: wait for ever in the queue, a minute for mpsd)"},
	{name: "no-wait", usage: "give up at once if the GPU is full or mpsd does not answer"},
	{name: "job", arg: "ID", usage: "tag the lease with batch job ID (mpsctl status shows it)"},
	{name: "no-slurm", usage: "ignore the Slurm job's environment (see below)"},
	{name: "socket", arg: "PATH", usage: "mpsd's socket (default $" + api.EnvSocket + ", else " + api.DefaultSocket + ")"},
	{name: "quiet", usage: "no queue, grant or requeue lines on stderr"},
	{name: "version", usage: "print the version (module version, commit, Go) and exit"},
	{name: "help", short: "h", usage: "print this usage and exit"},
}

// lookupFlag is the flag called name (without dashes), by its name or
// its one-letter name.
func lookupFlag(name string) (launcherFlag, bool) {
	for _, f := range flagTable {
		if f.name == name || (f.short != "" && f.short == name) {
			return f, true
		}
	}
	return launcherFlag{}, false
}

// usageColumn is where the flags' usage starts in Usage; usageWidth is
// how wide its lines are.
const (
	usageColumn = 18
	usageWidth  = 78
)

// Usage is the synopsis mps-launch prints for --help. It is built once,
// at start, as every mps-launch starts: in one buffer, without a copy of
// a word (mps-launch's start is on every launch's path).
var Usage = usageText()

func usageText() string {
	var b strings.Builder
	b.Grow(4096)
	b.WriteString("usage: " + usageSynopsis + "\n\n" + usageAbout + "\n")
	for _, f := range flagTable {
		b.WriteString("  --")
		b.WriteString(f.name)
		col := 4 + len(f.name)
		if f.arg != "" {
			b.WriteByte(' ')
			b.WriteString(f.arg)
			col += 1 + len(f.arg)
		}
		writeSpaces(&b, max(usageColumn-col, 1))
		writeWrapped(&b, f.usage)
	}
	b.WriteString(usageSlurm + "\nExit status: " + usageExit + "\n" + usageWaits + "\n")
	return b.String()
}

// writeWrapped writes s's words into lines that end before usageWidth,
// the lines after the first indented to usageColumn (a longer word
// stands alone), and a newline.
func writeWrapped(b *strings.Builder, s string) {
	n := 0 // bytes on the line so far, from usageColumn
	for s != "" {
		w := s
		if i := strings.IndexByte(s, ' '); i >= 0 {
			w, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		switch {
		case w == "":
			continue
		case n > 0 && n+1+len(w) > usageWidth-usageColumn:
			b.WriteByte('\n')
			writeSpaces(b, usageColumn)
			n = 0
		case n > 0:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	b.WriteByte('\n')
}

// writeSpaces writes n spaces (at most usageColumn).
func writeSpaces(b *strings.Builder, n int) {
	const spaces = "                                "
	b.WriteString(spaces[:min(n, len(spaces))])
}

// Options are mps-launch's parsed command line. Zero values of SM, Mem,
// GPUs and Group take the group's defaults.
type Options struct {
	SM    int
	Mem   int64
	GPUs  int
	Group string
	// Procs is --procs: how many CUDA processes the command runs, among
	// which the SM share is divided; 0 when not given (1).
	Procs int
	// Requeue is the --requeue cap; -1 when neither --requeue nor
	// --no-requeue was given (the group's default applies).
	Requeue int
	// Wait is --wait; 0 waits for ever unless NoWait.
	Wait   time.Duration
	NoWait bool
	Socket string
	Quiet  bool
	// GPUSelect is --gpu, or the Slurm job's GPUs: selectors of
	// package gpusel (checked for syntax only; mpsd resolves them). nil:
	// any GPU of the group.
	GPUSelect []string
	// JobID is --job, or the Slurm job (and step) id; "" for none.
	JobID string
	// NoSlurm is --no-slurm: the Slurm variables are not read.
	NoSlurm bool
	// SlurmJobUID is $SLURM_JOB_UID inside a Slurm job, the uid the job
	// runs as; -1 outside one, with --no-slurm, or when it is not set.
	// CheckUID compares it with the caller's.
	SlurmJobUID int
	// Command is the program and its arguments, never empty.
	Command []string
}

// The Slurm variables mps-launch reads inside a job (ParseArgs).
const (
	EnvSlurmJobID     = "SLURM_JOB_ID"
	EnvSlurmStepID    = "SLURM_STEP_ID"
	EnvSlurmJobUID    = "SLURM_JOB_UID"
	EnvSlurmStepGPUs  = "SLURM_STEP_GPUS"
	EnvSlurmJobGPUs   = "SLURM_JOB_GPUS"
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"
)

// errHelp is returned by ParseArgs for --help, errVersion for --version.
var (
	errHelp    = errors.New("launcher: help requested")
	errVersion = errors.New("launcher: version requested")
)

// flagNames are mps-launch's flags, for "did you mean".
func flagNames() []string {
	names := make([]string, len(flagTable))
	for i, f := range flagTable {
		names[i] = f.name
	}
	return names
}

// ParseArgs reads mps-launch's arguments. getenv supplies MPSD_SOCKET
// and, inside a Slurm job (SLURM_JOB_ID set, no --no-slurm), the defaults
// of --job, --sm and --gpu that Usage lists; a flag always wins over the
// environment, and a variable a flag overrides is not read. An empty
// variable counts as unset, and so does CUDA_VISIBLE_DEVICES=NoDevFiles
// (Slurm's word for a GPU resource without device files).
// Flags take `--name value` or `--name=value` (one dash works too); the
// command starts after `--` or at the first argument that is not a flag.
// Every error wraps ErrUsage and is one line naming the offending input,
// flag or environment variable.
func ParseArgs(args []string, getenv func(string) string) (Options, error) {
	o := Options{Requeue: -1, SlurmJobUID: -1}
	var requeueSet, noRequeue, waitSet, smSet, gpuSet, jobSet bool
	usage := func(format string, a ...any) (Options, error) {
		return Options{}, fmt.Errorf("%w: "+format, append([]any{ErrUsage}, a...)...)
	}
	i := 0
	for ; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			i++
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			break // the command, given without "--"
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(arg[1:], "-"), "=")
		flag := "--" + name
		// needValue returns the flag's value, from "=value" or the next argument.
		needValue := func() (string, bool) {
			if hasValue {
				return value, true
			}
			// "--" ends the flags: `--group -- cmd` lacks a value, it
			// does not name a group "--".
			if i+1 >= len(args) || args[i+1] == "--" {
				return "", false
			}
			i++
			return args[i], true
		}
		def, known := lookupFlag(name)
		if !known {
			return usage("%s (mps-launch --help lists the flags)", cli.UnknownFlag(arg, flagNames()))
		}
		switch def.name {
		case "help":
			return Options{}, errHelp
		case "version":
			return Options{}, errVersion
		}
		if def.arg == "" {
			if hasValue {
				return usage("%s takes no value", flag)
			}
			switch def.name {
			case "quiet":
				o.Quiet = true
			case "no-requeue":
				noRequeue = true
				o.Requeue = 0
			case "no-wait":
				o.NoWait = true
			case "no-slurm":
				o.NoSlurm = true
			}
			continue
		}
		v, ok := needValue()
		if !ok {
			return usage("%s needs a value", flag)
		}
		switch name {
		case "sm":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100 {
				return usage("--sm %q: want a whole percentage from 1 to 100", v)
			}
			o.SM, smSet = n, true
		case "mem":
			b, err := units.ParseSize(v)
			if err != nil {
				return usage("--mem %q: %s", v, sizeReason(err, v))
			}
			if b < units.MiB {
				return usage("--mem %q: below 1M, the smallest limit MPS enforces", v)
			}
			o.Mem = b
		case "gpus":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return usage("--gpus %q: want a whole number of GPUs, 1 or more", v)
			}
			o.GPUs = n
		case "procs":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > api.MaxProcs {
				return usage("--procs %q: want a whole number of processes from 1 to %d (MPS serves at most %d clients per GPU)", v, api.MaxProcs, api.MaxProcs)
			}
			o.Procs = n
		case "gpu":
			sel, reason := parseGPUList(v)
			if reason != "" {
				return usage("--gpu %q: %s", v, reason)
			}
			o.GPUSelect, gpuSet = sel, true
		case "job":
			if reason := badJobID(v); reason != "" {
				return usage("--job %q: %s", v, reason)
			}
			o.JobID, jobSet = v, true
		case "group":
			if v == "" {
				return usage("--group: empty group name")
			}
			o.Group = v
		case "requeue":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return usage("--requeue %q: want a whole number of relaunches, 0 or more", v)
			}
			requeueSet = true
			o.Requeue = n
		case "wait":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return usage("--wait %q: want a duration such as 30s, 5m or 1h30m", v)
			}
			if d == 0 {
				return usage("--wait %q: use --no-wait to not wait, or leave --wait out to wait for ever", v)
			}
			waitSet = true
			o.Wait = d
		case "socket":
			if v == "" {
				return usage("--socket: empty path")
			}
			o.Socket = v
		}
	}
	switch {
	case requeueSet && noRequeue:
		return usage("--requeue and --no-requeue exclude each other")
	case waitSet && o.NoWait:
		return usage("--wait and --no-wait exclude each other")
	case o.SM > 0 && o.Procs > o.SM:
		return usage("--procs %d is more than --sm %d: each process would get under 1%% of the SMs (at most %d processes for --sm %d)", o.Procs, o.SM, o.SM, o.SM)
	}
	o.Command = args[i:]
	if len(o.Command) == 0 {
		return usage("missing command: mps-launch [flags] -- COMMAND [ARG...]")
	}
	if o.Command[0] == "" {
		return usage("empty command name")
	}
	if o.Socket == "" {
		o.Socket = getenv(api.EnvSocket)
	}
	if o.Socket == "" {
		o.Socket = api.DefaultSocket
	}
	if o.NoSlurm || getenv(EnvSlurmJobID) == "" {
		return o, nil
	}
	if err := o.slurmDefaults(getenv, !jobSet, !smSet, !gpuSet); err != nil {
		return Options{}, err
	}
	return o, nil
}

// slurmDefaults fills in what a Slurm job's environment says and the
// flags left open: the job id, the SM share of a gres/mps allocation and
// the job's GPUs, and records SLURM_JOB_UID for CheckUID. Slurm sets
// these variables for every step (srun) and for the batch script, so
// their values are Slurm's unless a user changed them: a bad one is
// refused, naming it, rather than silently ignored.
func (o *Options) slurmDefaults(getenv func(string) string, job, sm, gpu bool) error {
	bad := func(name, v, reason, flag string) error {
		return fmt.Errorf("%w: %s %q: %s (it is the default of --%s in a Slurm job; give --%s, or --no-slurm)",
			ErrUsage, name, v, reason, flag, flag)
	}
	if job {
		id := getenv(EnvSlurmJobID)
		if step := getenv(EnvSlurmStepID); step != "" {
			// A step of the job (srun); the batch script has no step id.
			id += "." + step
		}
		if reason := badJobID(id); reason != "" {
			return bad(EnvSlurmJobID, id, reason, "job")
		}
		o.JobID = id
	}
	if v := getenv(api.EnvThreadPercentage); sm && v != "" {
		// Slurm's gres/mps sets it to the allocation's share of the GPU.
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return bad(api.EnvThreadPercentage, v, "want a whole percentage from 1 to 100", "sm")
		}
		o.SM = n
	}
	if gpu {
		// SLURM_STEP_GPUS and SLURM_JOB_GPUS hold the node's GPU indexes;
		// CUDA_VISIBLE_DEVICES holds the same, or with ConstrainDevices
		// indexes counted within the job, which would name another job's
		// GPUs to mpsd. So it only counts when Slurm set neither (gres
		// types without them, a job that set its own).
		for _, name := range []string{EnvSlurmStepGPUs, EnvSlurmJobGPUs, EnvVisibleDevices} {
			v := getenv(name)
			if v == "" || v == "NoDevFiles" {
				continue
			}
			sel, reason := parseGPUList(v)
			if reason != "" {
				return bad(name, v, reason, "gpu")
			}
			o.GPUSelect = sel
			break
		}
	}
	if v := getenv(EnvSlurmJobUID); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("%w: %s %q: want a numeric uid (--no-slurm ignores it)", ErrUsage, EnvSlurmJobUID, v)
		}
		o.SlurmJobUID = int(n)
	}
	return nil
}

// CheckUID refuses to run inside a Slurm job as another user than the
// job's (SlurmJobUID): mpsd would grant the lease to the caller, so the
// job's work would run and be accounted under another uid, tagged with
// the job's id. Root in a job's environment is the usual way there (sudo,
// an admin's shell that inherited it). It returns nil outside a job.
func (o Options) CheckUID(uid int) error {
	if o.SlurmJobUID < 0 || o.SlurmJobUID == uid {
		return nil
	}
	return fmt.Errorf("%w: %s is %d but mps-launch runs as uid %d: the lease would be uid %d's, not the job owner's; "+
		"run it as uid %d, or give --no-slurm to ignore the Slurm job's environment",
		ErrUsage, EnvSlurmJobUID, o.SlurmJobUID, uid, uid, o.SlurmJobUID)
}

// parseGPUList splits a comma-separated GPU list and checks each entry's
// syntax with package gpusel, the grammar mpsd resolves them with. It
// returns the entries, or why the list is refused ("" when it is not).
func parseGPUList(v string) ([]string, string) {
	entries := strings.Split(v, ",")
	for i := range entries {
		entries[i] = strings.TrimSpace(entries[i])
	}
	if len(entries) > api.MaxGPUSelect {
		return nil, fmt.Sprintf("%d GPUs, more than %d", len(entries), api.MaxGPUSelect)
	}
	if _, err := gpusel.ParseList(entries); err != nil {
		var es gpusel.Errors
		if errors.As(err, &es) {
			e := es[0]
			return nil, fmt.Sprintf("entry %d %q: %s", e.Pos+1, e.Entry, e.Reason)
		}
		return nil, err.Error()
	}
	return entries, ""
}

// badJobID is why id cannot tag a lease (the bounds of api.LeaseRequest's
// job_id), or "".
func badJobID(id string) string {
	switch {
	case id == "":
		return "empty job id"
	case len(id) > api.MaxJobIDLen:
		return fmt.Sprintf("longer than %d bytes", api.MaxJobIDLen)
	case !utf8.ValidString(id) || strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError }):
		return "control characters or not UTF-8"
	}
	return ""
}

// sizeReason is what ParseSize found wrong, without its own prefix and
// the quoted input that the caller already names.
func sizeReason(err error, in string) string {
	msg := err.Error()
	for _, sentinel := range []error{units.ErrSyntax, units.ErrRange} {
		if rest, ok := strings.CutPrefix(msg, fmt.Sprintf("%v %q: ", sentinel, in)); ok {
			return rest
		}
	}
	return msg
}

// LeaseRequest is the request these options make.
func (o Options) LeaseRequest() api.LeaseRequest {
	req := api.LeaseRequest{
		SM:        o.SM,
		MemBytes:  o.Mem,
		GPUs:      o.GPUs,
		Group:     o.Group,
		NoWait:    o.NoWait,
		Command:   shownCommand(o.Command),
		GPUSelect: o.GPUSelect,
		JobID:     o.JobID,
		Procs:     o.Procs,
		// mps-launch attaches its command as soon as it is granted.
		WillAttach: true,
	}
	if o.Requeue >= 0 {
		n := o.Requeue
		req.RequeueAttempts = &n
	}
	if o.Wait > 0 {
		// Round up: a sub-millisecond wait must not become 0, "for ever".
		ms := int64(o.Wait / time.Millisecond)
		if o.Wait%time.Millisecond != 0 {
			ms++
		}
		req.WaitMillis = ms
	}
	return req
}

// maxShownCommand bounds the bytes of the argv a lease request names for
// mpsd's status and logs (api.LeaseRequest.Command, display only). mpsd
// refuses a request whose Command is over api.MaxCommandBytes, and JSON
// may spell one byte in six (\u00XX), so a quarter of it stays inside
// api.MaxRequestBytes with the request's other fields too. The command
// itself runs with its whole argv.
const maxShownCommand = api.MaxCommandBytes / 4

// shownCommand is argv as the lease request names it: whole while it fits
// maxShownCommand, else its first arguments that fit, then a marker that
// says how many more the command has (a program name too long on its own
// is cut at a rune boundary, with an ellipsis). The marker has no spaces,
// so a status that quotes arguments with spaces shows it plainly.
func shownCommand(argv []string) []string {
	// Each argument costs its bytes and its JSON string's quotes and
	// comma: many empty ones add up too.
	n := 0
	for _, a := range argv {
		n += len(a) + 3
	}
	if n <= maxShownCommand {
		return argv
	}
	// Room for the marker (an ellipsis, a count, and words).
	budget := maxShownCommand - 64
	var shown []string
	for _, a := range argv {
		if len(a)+3 > budget {
			break
		}
		shown = append(shown, a)
		budget -= len(a) + 3
	}
	if len(shown) == 0 {
		// The program name is over the budget with its quotes and comma,
		// not always on its own: one that fits whole is kept whole.
		a := argv[0]
		if len(a) > budget {
			cut := budget
			for cut > 0 && !utf8.RuneStart(a[cut]) {
				cut--
			}
			a = a[:cut] + "…"
		}
		shown = append(shown, a)
	}
	switch more := len(argv) - len(shown); more {
	case 0:
	case 1:
		shown = append(shown, "…(+1-more-argument)")
	default:
		shown = append(shown, fmt.Sprintf("…(+%d-more-arguments)", more))
	}
	return shown
}
