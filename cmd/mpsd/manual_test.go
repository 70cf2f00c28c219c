package main

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/mpsd/mpsd/internal/manpage"
	"github.com/mpsd/mpsd/internal/manpage/manpagetest"
)

var update = flag.Bool("update", false, "rewrite the generated files TestManual checks")

// manualRegen is how the files TestManual checks are regenerated.
const manualRegen = "go test ./cmd/mpsd -run TestManual -update"

// TestManual keeps mpsd(8) and mpsd's completion scripts, committed under
// docs/, what defineFlags and the usage's texts generate: a flag added
// without them fails here.
func TestManual(t *testing.T) {
	root := filepath.Join("..", "..", "docs")
	manpagetest.Check(t, filepath.Join(root, "man", "mpsd.8"), manpage.Render(manual()), *update, manualRegen)
	p := completion()
	bash, err := manpage.Bash(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "bash", "mpsd"), bash, *update, manualRegen)
	zsh, err := manpage.Zsh(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "zsh", manpage.ZshFile("mpsd")), zsh, *update, manualRegen)
}
