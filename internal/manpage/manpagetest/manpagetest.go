// Package manpagetest is what the manual tests of the packages that own
// the programs' definitions share: the comparison of a page or a
// completion script, as package manpage renders it now, with the file
// committed under docs/man or docs/completion, and its rewriting with
// -update (make man).
//
// It never runs programs; the checks of the scripts themselves (bash -n,
// zsh -n, completing in a shell) are package manpage's tests.
package manpagetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Check compares got with the committed file at path (relative to the
// test's package directory), or, with update, writes got there. A
// difference fails the test naming the first line that differs and how
// to regenerate: regen is the command of the owning package's test
// ("go test ./internal/mpsctl -run TestManual -update").
func Check(t *testing.T, path, got string, update bool, regen string) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%v: regenerate it with make man (or %s)", err, regen)
		return
	}
	if got == string(want) {
		return
	}
	t.Errorf("%s is out of date with the definitions it is generated from: regenerate it with make man (or %s) and commit it\n%s",
		path, regen, firstDifference(string(want), got))
}

// firstDifference names the first line where the committed file (want)
// and the generated text (got) differ.
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl || i >= len(w) || i >= len(g) {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + wl + "\n  generated: " + gl
		}
	}
	return ""
}
