package mpsctl

import (
	"fmt"
	"strings"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/manpage"
)

// Manual is mpsctl(8), generated from what mpsctl's usage is generated
// from: the synopsis, the command table (each command's synopsis, long
// text and flags, as `mpsctl help NAME` shows them), the options and the
// exit statuses. docs/man/mpsctl.8 is its rendering (make man).
func Manual() manpage.Page {
	var cmds []manpage.Block
	for i := range commands {
		c := &commands[i]
		long := c.long
		if long == "" {
			long = c.summary
		}
		var flags []manpage.Block
		for _, o := range options(commandFlags(c)) {
			flags = append(flags, manpage.Item(o.tag, o.usage))
		}
		cmds = append(cmds, manpage.Block{Tag: strings.TrimSpace(c.name + " " + c.args), Text: long, Nested: flags})
	}
	cmds = append(cmds, manpage.Item("help [COMMAND]", capitalize(helpSummary)+": its synopsis, what it does and its flags."))
	global := newFlagSet("mpsctl")
	globalFlags(global)
	var opts []manpage.Block
	for _, o := range options(global) {
		opts = append(opts, manpage.Item(o.tag, o.usage))
	}
	opts = append(opts, manpage.Item("-h, --help", "print the usage (after a command: the command's) and exit"))
	return manpage.Page{
		Name: "mpsctl", Section: "8", Source: "mpsd", Manual: "System Manager's Manual",
		Summary:  "show and manage mpsd's MPS instances, leases and queues",
		Synopsis: synopsis,
		Sections: []manpage.Section{
			{Title: "Description", Blocks: []manpage.Block{manpage.Para(
				"mpsctl is the operator's command line of mpsd(8), the daemon that shares a host's GPUs " +
					"among tenant groups through CUDA MPS. Each COMMAND below talks to mpsd over its API " +
					"socket, except check-config, which checks a config file as mpsd would load it. " +
					"mpsd decides by the caller's credentials what it may see and do: the commands marked " +
					"for admins need a user or a unix group of the config's admins. " +
					"A command's flags may come before, among or after its arguments.")}},
			{Title: "Commands", Blocks: cmds},
			{Title: "Options", Blocks: opts},
			{Title: "Environment", Blocks: []manpage.Block{manpage.Item(api.EnvSocket,
				fmt.Sprintf("mpsd's socket when --socket is not given (default %s).", api.DefaultSocket))}},
			{Title: "Exit status", Blocks: []manpage.Block{manpage.Para(exitStatuses)}},
		},
		SeeAlso: []string{"mpsd(8)", "mps-launch(1)", "mpsd.yaml(5)"},
	}
}

// Completion is mpsctl's command line for the completion scripts: the
// options, and each command with its flags.
func Completion() manpage.Program {
	global := newFlagSet("mpsctl")
	globalFlags(global)
	p := manpage.Program{Name: "mpsctl", Flags: completionFlags(options(global))}
	p.Flags = append(p.Flags, manpage.Flag{Name: "help", Usage: "print the usage"})
	for i := range commands {
		c := &commands[i]
		args := manpage.NoArgs
		if strings.Contains(c.args, "FILE") {
			args = manpage.FileArgs
		}
		p.Commands = append(p.Commands, manpage.Command{
			Name: c.name, Summary: c.summary, Flags: completionFlags(options(commandFlags(c))), Args: args,
		})
	}
	p.Commands = append(p.Commands, manpage.Command{Name: "help", Summary: helpSummary, Args: manpage.CommandArgs})
	return p
}

// completionFlags are opts as the scripts complete them: an optional
// value ("[INTERVAL]") is not asked for.
func completionFlags(opts []option) []manpage.Flag {
	var fs []manpage.Flag
	for _, o := range opts {
		arg := o.arg
		if strings.HasPrefix(arg, "[") {
			arg = ""
		}
		fs = append(fs, manpage.Flag{Name: o.name, Arg: arg, Usage: o.usage})
	}
	return fs
}

// capitalize is s with its first letter in capitals.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
