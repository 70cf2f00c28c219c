package launcher

import (
	"fmt"
	"strings"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/manpage"
)

// Manual is mps-launch(1), generated from what its usage is generated
// from: the synopsis, flagTable and the texts on Slurm, the exit statuses
// and the waits. docs/man/mps-launch.1 is its rendering (make man).
func Manual() manpage.Page {
	var opts []manpage.Block
	for _, f := range flagTable {
		tag := strings.TrimSpace("--" + f.name + " " + f.arg)
		if f.short != "" {
			tag = "-" + f.short + ", " + tag
		}
		opts = append(opts, manpage.Item(tag, f.usage))
	}
	return manpage.Page{
		Name: "mps-launch", Section: "1", Source: "mpsd", Manual: "User Commands",
		Summary:  "run a command on a GPU shared through CUDA MPS, under a lease from mpsd",
		Synopsis: []string{usageSynopsis},
		Sections: []manpage.Section{
			{Title: "Description", Blocks: []manpage.Block{
				manpage.Para(usageAbout + " Flags come before COMMAND; the first argument that is no flag, or the one after --, starts it."),
				manpage.Para(usageWaits),
			}},
			{Title: "Options", Blocks: opts},
			{Title: "Environment", Blocks: []manpage.Block{
				manpage.Para(usageSlurm),
				manpage.Item(api.EnvSocket, fmt.Sprintf("mpsd's socket when --socket is not given (default %s).", api.DefaultSocket)),
			}},
			{Title: "Exit status", Blocks: []manpage.Block{manpage.Para(usageExit)}},
		},
		SeeAlso: []string{"mpsctl(8)", "mpsd(8)", "mpsd.yaml(5)"},
	}
}

// Completion is mps-launch's command line for the completion scripts:
// flagTable's flags, then the command it runs.
func Completion() manpage.Program {
	p := manpage.Program{Name: "mps-launch", RunsCommand: true}
	for _, f := range flagTable {
		p.Flags = append(p.Flags, manpage.Flag{Name: f.name, Arg: f.arg, Usage: f.usage})
	}
	return p
}
