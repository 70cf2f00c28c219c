package main

import (
	"flag"
	"io"
	"strings"

	"github.com/mpsd/mpsd/internal/cli"
	"github.com/mpsd/mpsd/internal/manpage"
)

// manual is mpsd(8), generated from what `mpsd --help` is generated
// from: the synopsis, what mpsd does, the flags defineFlags defines and
// the exit statuses. docs/man/mpsd.8 is its rendering (make man).
func manual() manpage.Page {
	var opts []manpage.Block
	for _, f := range flagList() {
		opts = append(opts, manpage.Item(strings.TrimSpace(cli.Dashes(f.Name)+" "+f.Arg), f.Usage))
	}
	opts = append(opts, manpage.Item("-h, --help", "print the usage and exit"))
	return manpage.Page{
		Name: "mpsd", Section: "8", Source: "mpsd", Manual: "System Manager's Manual",
		Summary:  "share a host's GPUs among tenant groups through CUDA MPS",
		Synopsis: usageSynopsis,
		Sections: []manpage.Section{
			{Title: "Description", Blocks: []manpage.Block{
				manpage.Para(usageAbout),
				manpage.Para("Its config file is described in mpsd.yaml(5); mpsctl check-config checks one as mpsd would load it."),
			}},
			{Title: "Options", Blocks: opts},
			{Title: "Files", Blocks: []manpage.Block{
				manpage.Item(defaultConfigPath, "the config file read without --config; see mpsd.yaml(5)"),
			}},
			{Title: "Exit status", Blocks: []manpage.Block{manpage.Para(usageExit)}},
		},
		SeeAlso: []string{"mpsctl(8)", "mps-launch(1)", "mpsd.yaml(5)"},
	}
}

// completion is mpsd's command line for the completion scripts.
func completion() manpage.Program {
	return manpage.Program{Name: "mpsd", Flags: append(flagList(), manpage.Flag{Name: "help", Usage: "print the usage and exit"})}
}

// flagList is mpsd's flags as defineFlags defines them, in name order
// (as --help lists them).
func flagList() []manpage.Flag {
	fs := flag.NewFlagSet("mpsd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defineFlags(fs)
	var out []manpage.Flag
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		out = append(out, manpage.Flag{Name: f.Name, Arg: arg, Usage: usage})
	})
	return out
}
