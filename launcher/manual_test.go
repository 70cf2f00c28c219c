package launcher

import (
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/manpage"
	"github.com/mpsd/mpsd/internal/manpage/manpagetest"
)

var update = flag.Bool("update", false, "rewrite the generated files TestManual checks")

// manualRegen is how the files TestManual checks are regenerated.
const manualRegen = "go test ./launcher -run TestManual -update"

// TestManual keeps mps-launch(1) and its completion scripts, committed
// under docs/, what flagTable and the usage's texts generate.
func TestManual(t *testing.T) {
	root := filepath.Join("..", "docs")
	manpagetest.Check(t, filepath.Join(root, "man", "mps-launch.1"), manpage.Render(Manual()), *update, manualRegen)
	p := Completion()
	bash, err := manpage.Bash(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "bash", "mps-launch"), bash, *update, manualRegen)
	zsh, err := manpage.Zsh(p)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join(root, "completion", "zsh", manpage.ZshFile("mps-launch")), zsh, *update, manualRegen)
}

// TestFlagTableDrivesParseArgs: every flag of the table is one ParseArgs
// knows, taking a value exactly when the table gives it a placeholder,
// and Usage lists it.
func TestFlagTableDrivesParseArgs(t *testing.T) {
	for _, f := range flagTable {
		t.Run(f.name, func(t *testing.T) {
			if !strings.Contains(Usage, "  --"+f.name+" ") && !strings.Contains(Usage, "  --"+f.name+"\n") {
				t.Errorf("Usage does not list --%s", f.name)
			}
			// With "=value": refused for a flag without one ("takes no
			// value"), never unknown.
			_, err := ParseArgs([]string{"--" + f.name + "=1", "true"}, noEnv)
			if err != nil && strings.Contains(err.Error(), "unknown flag") {
				t.Fatalf("ParseArgs does not know --%s: %v", f.name, err)
			}
			if f.arg == "" && f.name != "help" && f.name != "version" && (err == nil || !strings.Contains(err.Error(), "takes no value")) {
				t.Errorf("--%s=1: %v, want it refused: it takes no value", f.name, err)
			}
			// Without a value at the end: refused for a flag with one.
			_, err = ParseArgs([]string{"--" + f.name}, noEnv)
			if f.arg != "" && (err == nil || !strings.Contains(err.Error(), "needs a value")) {
				t.Errorf("--%s at the end: %v, want it refused: it needs a value", f.name, err)
			}
		})
	}
}
