package mpsctl

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/manpage"
	"github.com/mpsd/mpsd/internal/manpage/manpagetest"
)

// manualRegen is how the files TestManual checks are regenerated.
const manualRegen = "go test ./internal/mpsctl -run TestManual -update"

// TestManual keeps mpsctl(8) and mpsctl's completion scripts, committed
// under docs/, what the command table, the options and the exit statuses
// generate: a command or a flag added without them fails here.
func TestManual(t *testing.T) {
	root := filepath.Join("..", "..", "docs")
	manpagetest.Check(t, filepath.Join(root, "man", "mpsctl.8"), manpage.Render(Manual()), *update, manualRegen)
	p := Completion()
	bash, err := manpage.Bash(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "bash", "mpsctl"), bash, *update, manualRegen)
	zsh, err := manpage.Zsh(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "zsh", manpage.ZshFile("mpsctl")), zsh, *update, manualRegen)
}

// TestManualNamesEveryCommandAndFlag: the page and the completion carry
// each command of the table and each of its flags, as its help does.
func TestManualNamesEveryCommandAndFlag(t *testing.T) {
	page := manpage.Render(Manual())
	comp := Completion()
	for i := range commands {
		c := &commands[i]
		if !strings.Contains(page, manpage.Styled(strings.TrimSpace(c.name+" "+c.args))) {
			t.Errorf("mpsctl(8) has no entry for %s", c.name)
		}
		var got *manpage.Command
		for j := range comp.Commands {
			if comp.Commands[j].Name == c.name {
				got = &comp.Commands[j]
			}
		}
		if got == nil {
			t.Errorf("the completion has no command %s", c.name)
			continue
		}
		help := commandUsage(c)
		for _, f := range got.Flags {
			if !strings.Contains(help, f.Dashed()) {
				t.Errorf("the completion offers %s %s, which mpsctl help %s does not list", c.name, f.Dashed(), c.name)
			}
		}
		if n := strings.Count(help, "\n  -"); n != len(got.Flags) {
			t.Errorf("mpsctl help %s lists %d flags, the completion %d", c.name, n, len(got.Flags))
		}
	}
}
