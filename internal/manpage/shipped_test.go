package manpage

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// docs is where the generated pages and scripts are committed; the tests
// of the packages that own the definitions keep them up to date.
const docs = "../../docs"

// shipped lists the committed pages and scripts.
var shipped = map[string][]string{
	"man":             {"mps-launch.1", "mpsctl.8", "mpsd.8", "mpsd.yaml.5"},
	"completion/bash": {"mps-launch", "mpsctl", "mpsd"},
	"completion/zsh":  {"_mps_launch", "_mpsctl", "_mpsd"},
}

// TestShippedFiles: docs/man and docs/completion hold the pages and the
// scripts of the three programs and nothing else, the pages are clean
// troff, and the scripts parse.
func TestShippedFiles(t *testing.T) {
	for dir, want := range shipped {
		entries, err := os.ReadDir(filepath.Join(docs, dir))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, want) {
			t.Errorf("docs/%s holds %q, want %q (make man writes them)", dir, got, want)
		}
	}
	for _, name := range shipped["man"] {
		checkTroff(t, name, read(t, filepath.Join(docs, "man", name)))
	}
	for _, name := range shipped["completion/bash"] {
		checkShell(t, "bash", name, read(t, filepath.Join(docs, "completion", "bash", name)))
	}
	for _, program := range shipped["completion/bash"] {
		name := ZshFile(program)
		script := read(t, filepath.Join(docs, "completion", "zsh", name))
		checkShell(t, "zsh", name, script)
		// Sourced after compinit, it registers itself for the program
		// with compdef.
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(need(t, "zsh"), "-f", "-c",
			`autoload -U compinit && compinit -u -D && source "$1" && print -r -- ${_comps[$2]}`, "zsh", path, program).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != name {
			t.Errorf("zsh: sourcing %s: %v; completes %s with %q, want %s", name, err, program, out, name)
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestShippedBashCompletes completes the three programs' command lines
// with the committed bash scripts.
func TestShippedBashCompletes(t *testing.T) {
	for _, tc := range []struct {
		name, program string
		words, want   []string
	}{
		{"mpsctl dr<TAB>", "mpsctl", []string{"dr"}, []string{"drain"}},
		{"mpsctl re<TAB>", "mpsctl", []string{"re"}, []string{"requeue", "restart", "resume"}},
		{"mpsctl status --gr<TAB>", "mpsctl", []string{"status", "--gr"}, []string{"--group"}},
		{"mpsctl --socket S dr<TAB>", "mpsctl", []string{"--socket", "/run/x.sock", "dr"}, []string{"drain"}},
		{"mpsctl check-config <TAB>", "mpsctl", []string{"check-config", "mo"}, []string{"model.yaml"}},
		{"mpsctl help ch<TAB>", "mpsctl", []string{"help", "ch"}, []string{"check-config"}},
		{"mps-launch --s<TAB>", "mps-launch", []string{"--s"}, []string{"--sm", "--socket"}},
		{"mps-launch --no-<TAB>", "mps-launch", []string{"--no-"}, []string{"--no-requeue", "--no-slurm", "--no-wait"}},
		{"mps-launch --sm 30 -- COMMAND ARG<TAB>", "mps-launch", []string{"--sm", "30", "--", "true", "no"}, []string{"notes.txt"}},
		{"mpsd --sim<TAB>", "mpsd", []string{"--sim"}, []string{"--simulate"}},
		{"mpsd --config <TAB>", "mpsd", []string{"--config", "mo"}, []string{"model.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := read(t, filepath.Join(docs, "completion", "bash", tc.program))
			got := complete(t, script, tc.program, append([]string{tc.program}, tc.words...)...)
			if !slices.Equal(got, tc.want) {
				t.Errorf("offers %q, want %q", got, tc.want)
			}
		})
	}
}
