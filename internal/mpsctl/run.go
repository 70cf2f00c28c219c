package mpsctl

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/buildinfo"
	"github.com/mpsd/mpsd/internal/cli"
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/internal/manpage"
)

// Exit statuses of mpsctl.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailure: mpsd refused or failed, could not be reached, or the
	// config is invalid.
	ExitFailure = 1
	// ExitUsage: unknown command or flag, missing or extra argument.
	ExitUsage = 2
)

// ErrUsage is wrapped by every error about the command line.
var ErrUsage = errors.New("usage error")

// errReported: the command has already printed why it failed.
var errReported = errors.New("mpsctl: failure already reported")

// usageError is a problem with the command line of cmd (nil: before the
// command was known).
type usageError struct {
	cmd *command
	msg string
}

func (e *usageError) Error() string { return e.msg }
func (e *usageError) Unwrap() error { return ErrUsage }

// usagef reports a problem with a command's arguments; Run adds the
// command and prints its usage.
func usagef(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// Config is what Run needs beyond the arguments; Main builds it from the
// process.
type Config struct {
	// Stdout gets the commands' output; Stderr one line per failure, and
	// notes. Nil discards.
	Stdout, Stderr io.Writer
	// Getenv supplies $MPSD_SOCKET; nil means an empty environment.
	Getenv func(string) string
	// Timeout bounds each request to mpsd; 0 means DefaultTimeout.
	Timeout time.Duration
	// NVML returns the library check-config reads this host's GPUs
	// through; nil means nvml.New.
	NVML func() nvml.Interface
	// LookupUser resolves a uid to a user name for status; nil means the
	// host's user database (os/user). "" shows the uid.
	LookupUser Names
	// LookupUID resolves a user name to its uid for status --user; nil
	// means the host's user database (os/user).
	LookupUID func(name string) (uint32, bool)
	// Clock times status --watch; nil means the real clock.
	Clock clock.Clock
	// IsTerminal says whether status --watch draws on a terminal (it
	// clears the screen first); nil means asking the kernel of Stdout.
	IsTerminal func(io.Writer) bool
}

// invocation is one run of one command.
type invocation struct {
	stdout, stderr io.Writer
	cfg            Config
	socket         string
	c              *Client
	// level is the API level of what the command used beyond its
	// table's (uses).
	level int
}

// uses says the command is about to use what API level needs (a flag
// that sends a field of that level), for warnSkew.
func (inv *invocation) uses(level int) { inv.level = max(inv.level, level) }

// names resolves uids for status through Config.LookupUser or the
// host's user database, each uid once.
func (inv *invocation) names() Names {
	look := inv.cfg.LookupUser
	if look == nil {
		look = func(uid uint32) string {
			u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
			if err != nil {
				return ""
			}
			return u.Username
		}
	}
	seen := map[uint32]string{}
	return func(uid uint32) string {
		n, ok := seen[uid]
		if !ok {
			n = look(uid)
			seen[uid] = n
		}
		return n
	}
}

// client connects to the socket chosen by --socket, $MPSD_SOCKET or
// api.DefaultSocket.
func (inv *invocation) client() *Client {
	if inv.c == nil {
		inv.c = NewClient(inv.socket, inv.cfg.Timeout)
	}
	return inv.c
}

// warnSkew prints, once, the line that says mpsd serves a lower API
// level than cmd uses (client.SkewWarning), if mpsd answered at all.
func (inv *invocation) warnSkew(cmd *command) {
	if inv.c == nil {
		return
	}
	s, ok := inv.c.Served()
	if !ok {
		return
	}
	if w := client.SkewWarning("mpsctl", buildinfo.Read().Version, max(cmd.level, inv.level, api.LevelBase), s); w != "" {
		fmt.Fprintf(inv.stderr, "mpsctl: %s\n", w)
	}
}

func (inv *invocation) nvml() nvml.Interface {
	if inv.cfg.NVML != nil {
		return inv.cfg.NVML()
	}
	return nvml.New()
}

// Main is mpsctl: it runs the command args names (without the program
// name) with the process's output and environment, and returns the exit
// status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, environ []string) int {
	return Run(ctx, Config{
		Stdout: stdout,
		Stderr: stderr,
		Getenv: func(k string) string {
			for _, kv := range environ {
				if name, val, ok := strings.Cut(kv, "="); ok && name == k {
					return val // the first one, as os.Getenv
				}
			}
			return ""
		},
	}, args)
}

// Run parses args (global flags, the command, its flags and arguments),
// runs the command and returns the exit status (ExitCode). Every failure
// has printed one line on cfg.Stderr, usage errors the usage too; help
// goes to cfg.Stdout.
func Run(ctx context.Context, cfg Config, args []string) int {
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.Getenv == nil {
		cfg.Getenv = func(string) string { return "" }
	}
	err := run(ctx, cfg, args)
	var ue *usageError
	switch {
	case err == nil:
	case errors.As(err, &ue) && cli.IsUnknown(ue.msg):
		// A name that does not exist: what was meant, if it is near one
		// that does, and where the names are, not the whole usage.
		fmt.Fprintf(cfg.Stderr, "mpsctl: %s\n", oneLine(ue.msg))
		fmt.Fprintln(cfg.Stderr, usageHint(ue.cmd))
	case errors.As(err, &ue):
		fmt.Fprintf(cfg.Stderr, "mpsctl: %s\n\n", oneLine(ue.msg))
		if ue.cmd != nil {
			fmt.Fprint(cfg.Stderr, commandUsage(ue.cmd))
		} else {
			fmt.Fprint(cfg.Stderr, Usage())
		}
	case errors.Is(err, errReported):
	default:
		fmt.Fprintf(cfg.Stderr, "mpsctl: %s\n", oneLine(err.Error()))
	}
	return ExitCode(err)
}

// ExitCode maps Run's errors to exit statuses: nil ExitOK, ErrUsage
// ExitUsage, anything else ExitFailure.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	default:
		return ExitFailure
	}
}

func run(ctx context.Context, cfg Config, args []string) error {
	global := newFlagSet("mpsctl")
	socket, version := globalFlags(global)
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, err := fmt.Fprint(cfg.Stdout, Usage())
			return err
		}
		return usagef("%s", cli.FlagError(err, global))
	}
	if *version {
		_, err := fmt.Fprintln(cfg.Stdout, buildinfo.Read().Line("mpsctl"))
		return err
	}
	rest := global.Args()
	if len(rest) == 0 {
		return usagef("no command given")
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return help(cfg.Stdout, rest)
	}
	cmd := lookup(name)
	if cmd == nil {
		return usagef("%s", cli.UnknownCommand(name, commandNames()))
	}

	fs := newFlagSet(name)
	var cmdSocket socketFlag
	if cmd.daemon {
		fs.Var(&cmdSocket, "socket", "")
	}
	runCmd := cmd.setup(fs)
	positional, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		_, err := fmt.Fprint(cfg.Stdout, commandUsage(cmd))
		return err
	}
	if err != nil {
		return &usageError{cmd: cmd, msg: name + ": " + cli.FlagError(err, fs)}
	}

	inv := &invocation{stdout: cfg.Stdout, stderr: cfg.Stderr, cfg: cfg}
	switch {
	case cmdSocket.set:
		inv.socket = cmdSocket.path
	case socket.set:
		inv.socket = socket.path
	case cfg.Getenv(api.EnvSocket) != "":
		inv.socket = cfg.Getenv(api.EnvSocket)
	default:
		inv.socket = api.DefaultSocket
	}
	err = runCmd(ctx, inv, positional)
	inv.warnSkew(cmd)
	if ue := (*usageError)(nil); errors.As(err, &ue) && ue.cmd == nil {
		return &usageError{cmd: cmd, msg: name + ": " + ue.msg}
	}
	return err
}

// help is `mpsctl help [COMMAND]`.
func help(stdout io.Writer, args []string) error {
	switch {
	case len(args) == 0:
		_, err := fmt.Fprint(stdout, Usage())
		return err
	case len(args) > 1:
		return usagef("help: unexpected argument %q", args[1])
	}
	cmd := lookup(args[0])
	if cmd == nil {
		return usagef("help: %s", cli.UnknownCommand(args[0], commandNames()))
	}
	_, err := fmt.Fprint(stdout, commandUsage(cmd))
	return err
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseInterspersed parses fs's flags wherever they appear in args and
// returns the other arguments in order; everything after "--" is an
// argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional, tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(positional, tail...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// usageHint is the line after an unknown command or flag: where to
// read the names there are.
func usageHint(cmd *command) string {
	if cmd == nil {
		return "Run 'mpsctl help' for the commands and options."
	}
	return fmt.Sprintf("Run 'mpsctl help %s' for its flags.", cmd.name)
}

// commandNames are the commands' names, help's among them.
func commandNames() []string {
	names := []string{"help"}
	for _, c := range commands {
		names = append(names, c.name)
	}
	return names
}

// socketFlag is --socket: a non-empty path, and whether it was given.
type socketFlag struct {
	path string
	set  bool
}

func (s *socketFlag) String() string { return s.path }

func (s *socketFlag) Set(v string) error {
	if v == "" {
		return errors.New("empty path")
	}
	s.path, s.set = v, true
	return nil
}

// synopsis holds the forms of mpsctl's command line.
var synopsis = []string{"mpsctl [--socket PATH] COMMAND [ARGS]", "mpsctl --version"}

// globalFlags defines mpsctl's options before the command on fs.
func globalFlags(fs *flag.FlagSet) (*socketFlag, *bool) {
	var socket socketFlag
	fs.Var(&socket, "socket", fmt.Sprintf("`PATH` is mpsd's socket (default $%s, else %s); also accepted after the command's name", api.EnvSocket, api.DefaultSocket))
	version := fs.Bool("version", false, "print mpsctl's version, commit and Go version")
	return &socket, version
}

// exitStatuses says what ExitCode's statuses mean.
const exitStatuses = "0 success; 1 mpsd refused or failed, could not be reached, or\n" +
	"the config is invalid; 2 usage error."

// helpSummary is the command list's line for help, which is no entry of
// commands.
const helpSummary = "show this help, or a command's"

// Usage is mpsctl's synopsis, generated from the command table and the
// options.
func Usage() string {
	var b bytes.Buffer
	b.WriteString("usage: " + strings.Join(synopsis, "\n       ") + "\n\nCommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
	fmt.Fprintf(tw, "  help [COMMAND]\t%s\n", helpSummary)
	_ = tw.Flush()
	b.WriteString("\nOptions:\n")
	global := newFlagSet("mpsctl")
	globalFlags(global)
	opts := options(global)
	width := 0
	for _, o := range opts {
		width = max(width, len(o.tag))
	}
	for _, o := range opts {
		// The usage wrapped to 80 columns, under itself.
		for i, l := range manpage.Wrap(o.usage, 80-width-4) {
			tag := ""
			if i == 0 {
				tag = o.tag
			}
			fmt.Fprintf(&b, "  %-*s  %s\n", width, tag, l)
		}
	}
	b.WriteString("Exit status: " + exitStatuses + "\n")
	return b.String()
}

// option is a flag as a usage text or a page shows it: "--socket PATH"
// and what it does.
type option struct {
	name, arg, tag, usage string
}

// options lists fs's flags in name order, as package flag visits them
// (and cli.FlagTable shows them); a boolean flag whose usage names a
// value takes it optionally ("--watch [INTERVAL]").
func options(fs *flag.FlagSet) []option {
	var out []option
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if b, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool && b.IsBoolFlag() && arg != "" {
			arg = "[" + arg + "]"
		}
		out = append(out, option{name: f.Name, arg: arg, tag: strings.TrimSpace(cli.Dashes(f.Name) + " " + arg), usage: usage})
	})
	return out
}

// commandUsage is `mpsctl help NAME`.
func commandUsage(cmd *command) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "usage: mpsctl [--socket PATH] %s\n", strings.TrimSpace(cmd.name+" "+cmd.args))
	long := cmd.long
	if long == "" {
		long = cmd.summary
	}
	fmt.Fprintf(&b, "\n%s\n", long)
	if t := cli.FlagTable(commandFlags(cmd)); t != "" {
		b.WriteString("\n" + t)
	}
	return b.String()
}

// commandFlags is cmd's flags as its help lists them: its setup's, and
// --socket for a command that talks to mpsd.
func commandFlags(cmd *command) *flag.FlagSet {
	fs := newFlagSet(cmd.name)
	if cmd.daemon {
		fs.Var(&socketFlag{}, "socket", fmt.Sprintf("`PATH` is mpsd's socket (default $%s, else %s)", api.EnvSocket, api.DefaultSocket))
	}
	cmd.setup(fs)
	return fs
}

// oneLine keeps a message to one line: mpsd's messages and file errors
// are data, and mpsctl prints one line per failure.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
