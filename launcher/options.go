package launcher

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// Usage is the synopsis mps-launch prints for --help.
const Usage = `usage: mps-launch [--sm PCT] [--mem SIZE] [--gpus N] [--group NAME]
                  [--requeue N|--no-requeue] [--wait DURATION|--no-wait]
                  [--socket PATH] [--quiet] -- COMMAND [ARG...]

Runs COMMAND on a GPU shared through CUDA MPS, under a lease from mpsd.
  --sm PCT        percent of each GPU's SMs, 1-100 (default: the group's)
  --mem SIZE      pinned device memory per GPU: 8G, 8GiB, 512M, 1.5G, bytes;
                  units are binary (default: the group's)
  --gpus N        number of GPUs (default 1)
  --group NAME    tenant group (default: your only or first group)
  --requeue N     relaunch at most N times if a fault revokes the lease
                  (default: the group's requeue_attempts)
  --no-requeue    never relaunch
  --wait DURATION give up after waiting this long in the queue (e.g. 90s, 5m;
                  default: wait for ever)
  --no-wait       give up at once if the GPU is full
  --socket PATH   mpsd's socket (default $MPSD_SOCKET, else /run/mpsd/mpsd.sock)
  --quiet         no status or requeue lines on stderr
Exit status: COMMAND's; 128+N if it died by signal N; 125 launcher or mpsd
error; 126 COMMAND not executable; 127 COMMAND not found; 75 wait timed out
or requeue attempts used up.
`

// Options are mps-launch's parsed command line. Zero values of SM, Mem,
// GPUs and Group take the group's defaults.
type Options struct {
	SM    int
	Mem   int64
	GPUs  int
	Group string
	// Requeue is the --requeue cap; -1 when neither --requeue nor
	// --no-requeue was given (the group's default applies).
	Requeue int
	// Wait is --wait; 0 waits for ever unless NoWait.
	Wait   time.Duration
	NoWait bool
	Socket string
	Quiet  bool
	// Command is the program and its arguments, never empty.
	Command []string
}

// errHelp is returned by ParseArgs for --help.
var errHelp = errors.New("launcher: help requested")

// ParseArgs reads mps-launch's arguments. getenv supplies MPSD_SOCKET.
// Flags take `--name value` or `--name=value` (one dash works too); the
// command starts after `--` or at the first argument that is not a flag.
// Every error wraps ErrUsage and is one line naming the offending input.
func ParseArgs(args []string, getenv func(string) string) (Options, error) {
	o := Options{Requeue: -1}
	var requeueSet, noRequeue, waitSet bool
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
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		noValue := func() bool { return !hasValue }
		switch name {
		case "h", "help":
			return Options{}, errHelp
		case "quiet":
			if !noValue() {
				return usage("%s takes no value", flag)
			}
			o.Quiet = true
			continue
		case "no-requeue":
			if !noValue() {
				return usage("%s takes no value", flag)
			}
			noRequeue = true
			o.Requeue = 0
			continue
		case "no-wait":
			if !noValue() {
				return usage("%s takes no value", flag)
			}
			o.NoWait = true
			continue
		case "sm", "mem", "gpus", "group", "requeue", "wait", "socket":
		default:
			return usage("unknown flag %s (mps-launch --help lists the flags)", strings.SplitN(arg, "=", 2)[0])
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
			o.SM = n
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
	return o, nil
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
		SM:       o.SM,
		MemBytes: o.Mem,
		GPUs:     o.GPUs,
		Group:    o.Group,
		NoWait:   o.NoWait,
		Command:  o.Command,
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
