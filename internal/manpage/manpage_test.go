package manpage

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/manpage/manpagetest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const regen = "go test ./internal/manpage -update"

func TestEscapeText(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "runs COMMAND", "runs COMMAND"},
		{"dashes", "--sm and a well-known x", `\-\-sm and a well\-known x`},
		{"backslash", `a\b \fB`, `a\eb \efB`},
		{"non-ASCII", "8 × 2³⁰…", `8 \[u00D7] 2\[u00B3]\[u2070]\[u2026]`},
		{"control", "a\x00b\x1bc", "abc"},
		{"quotes stay", `"x" 'y'`, `"x" 'y'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := escapeText(tc.in); got != tc.want {
				t.Errorf("escapeText(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestEscapeLine(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		literal  bool
		want     string
	}{
		{"leading dot", ".SH not a request", false, `\&.SH not a request`},
		{"leading quote", "'br not a request", false, `\&'br not a request`},
		{"dot after space is trimmed, then protected", "  .x", false, `\&.x`},
		{"literal keeps indentation", "  .x", true, `  .x`},
		{"empty literal line", "", true, `\&`},
		{"dot inside", "a.b", false, "a.b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := escapeLine(tc.in, tc.literal); got != tc.want {
				t.Errorf("escapeLine(%q, %v) = %q, want %q", tc.in, tc.literal, got, tc.want)
			}
		})
	}
}

func TestStyled(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--sm PCT", `\fB\-\-sm\fR \fIPCT\fR`},
		{"[--requeue N|--no-requeue]", `[\fB\-\-requeue\fR \fIN\fR|\fB\-\-no\-requeue\fR]`},
		{"-- COMMAND [ARG...]", `\fB\-\-\fR \fICOMMAND\fR [\fIARG\fR...]`},
		{"--log-format text|json", `\fB\-\-log\-format\fR \fBtext\fR|\fBjson\fR`},
		{"--kubelet-groups G,...", `\fB\-\-kubelet\-groups\fR \fIG\fR,...`},
		{"$MPSD_SOCKET", `\fB$MPSD_SOCKET\fR`},
		{"128+N", `\fI128+N\fR`},
		{"COMMAND's", `\fICOMMAND\fR'\fBs\fR`},
		{`a\b`, `\fBa\fR\e\fBb\fR`},
	} {
		if got := Styled(tc.in); got != tc.want {
			t.Errorf("Styled(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// samplePage has one of everything Render writes.
var samplePage = Page{
	Name: "tool", Section: "1", Source: "mpsd", Manual: "User Commands",
	Summary:  `does things with "quotes" and \backslashes`,
	Synopsis: []string{"tool [--flag N]\n     [--other FILE] -- COMMAND [ARG...]", "tool --version"},
	Sections: []Section{
		{Title: "Description", Blocks: []Block{
			Para("First paragraph,\nwrapped in the source.\n\nA second one.\n.starts with a dot after a break"),
			{Text: "literal\n  .indented\n\nafter a blank", Literal: true},
		}},
		{Title: "Options", Blocks: []Block{
			Item("--flag N", "a flag; N's range is 1-100"),
			Item("--other FILE", "two paragraphs\n\nin one item"),
			{Tag: "sub [--x]", Text: "a command", Nested: []Block{Item("--x", "its flag"), Item("--y N", "another")}},
			Para("After the list."),
		}},
	},
	SeeAlso: []string{"mpsctl(8)", "mpsd.yaml(5)"},
}

func TestRenderGolden(t *testing.T) {
	manpagetest.Check(t, filepath.Join("testdata", "tool.1"), Render(samplePage), *update, regen)
}

// TestRenderIsCleanTroff has groff check the sample page (every warning
// is an error), and mandoc lint it where it is installed.
func TestRenderIsCleanTroff(t *testing.T) {
	checkTroff(t, "tool.1", Render(samplePage))
}

// checkTroff formats page with groff -man -ww (warnings fail) and lints
// it with mandoc -Tlint; CI installs both (.ci/run).
func checkTroff(t *testing.T, name, page string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	groff := need(t, "groff")
	out, err := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("groff -man -ww %s: %v\n%s", name, err, out)
	}
	mandoc := need(t, "mandoc")
	// -Wwarning: style notes are not failures, and neither is the
	// missing date of .TH, left out on purpose: the same definitions
	// give the same page.
	out, _ = exec.Command(mandoc, "-Tlint", "-Wwarning", path).CombinedOutput()
	var problems []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" && !strings.Contains(l, "missing date") {
			problems = append(problems, l)
		}
	}
	if len(problems) > 0 {
		t.Errorf("mandoc -Tlint -Wwarning %s:\n%s", name, strings.Join(problems, "\n"))
	}
}

// need is the path of program, or skips saying what to install.
func need(t *testing.T, program string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		t.Skipf("%s is not installed (.ci/run installs it): %v", program, err)
	}
	return p
}

// sampleProgram has commands, value flags of each kind and every Args.
var sampleProgram = Program{
	Name:  "tool-ctl",
	Flags: []Flag{{Name: "socket", Arg: "PATH", Usage: "the socket [default /run/x]"}, {Name: "version", Usage: "print the version"}},
	Commands: []Command{
		{Name: "status", Summary: "show: it's all", Flags: []Flag{
			{Name: "o", Arg: "FORMAT", Usage: "output FORMAT"},
			{Name: "json", Usage: "as JSON"},
			{Name: "group", Arg: "G", Usage: "a group"},
		}},
		{Name: "drain", Summary: "close", Flags: []Flag{{Name: "gpu", Arg: "SEL", Usage: "a GPU"}}},
		{Name: "check", Summary: "check a file", Flags: []Flag{{Name: "dir", Arg: "DIR", Usage: "a directory"}}, Args: FileArgs},
		{Name: "shutdown", Summary: "stop"},
		{Name: "help", Summary: "help", Args: CommandArgs},
	},
}

var sampleLauncher = Program{
	Name: "tool-run",
	Flags: []Flag{
		{Name: "sm", Arg: "PCT", Usage: "percent"},
		{Name: "socket", Arg: "PATH", Usage: "socket"},
		{Name: "quiet", Usage: "quiet"},
	},
	RunsCommand: true,
}

var sampleFlagsOnly = Program{
	Name:  "toold",
	Flags: []Flag{{Name: "config", Arg: "FILE", Usage: "config"}, {Name: "simulate", Usage: "simulate"}},
}

func TestCompletionGolden(t *testing.T) {
	for _, p := range []Program{sampleProgram, sampleLauncher, sampleFlagsOnly} {
		sh, err := Bash(p)
		if err != nil {
			t.Fatal(err)
		}
		manpagetest.Check(t, filepath.Join("testdata", p.Name+".bash"), sh, *update, regen)
		zsh, err := Zsh(p)
		if err != nil {
			t.Fatal(err)
		}
		manpagetest.Check(t, filepath.Join("testdata", ZshFile(p.Name)+".zsh"), zsh, *update, regen)
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Program
		want string // in the error; "" for none
	}{
		{"fine", sampleProgram, ""},
		{"program name", Program{Name: "a b"}, `program "a b": not a name`},
		{"flag name", Program{Name: "a", Flags: []Flag{{Name: "x;rm"}}}, `flag "x;rm": not a name`},
		{"flag twice", Program{Name: "a", Flags: []Flag{{Name: "x"}, {Name: "x"}}}, `flag "x": given twice`},
		{"command name", Program{Name: "a", Commands: []Command{{Name: "$(x)"}}}, `command "$(x)": not a name`},
		{"command twice", Program{Name: "a", Commands: []Command{{Name: "x"}, {Name: "x"}}}, `command "x": given twice`},
		{"command's flag", Program{Name: "a", Commands: []Command{{Name: "x", Flags: []Flag{{Name: "-y"}}}}}, `command x: flag "-y": not a name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want an error with %q", err, tc.want)
			}
			if tc.want == "" {
				return
			}
			if _, err := Bash(tc.p); err == nil {
				t.Error("Bash rendered a program that Check refuses")
			}
			if _, err := Zsh(tc.p); err == nil {
				t.Error("Zsh rendered a program that Check refuses")
			}
		})
	}
}

func TestCompletionScriptsParse(t *testing.T) {
	for _, p := range []Program{sampleProgram, sampleLauncher, sampleFlagsOnly} {
		sh, _ := Bash(p)
		zsh, _ := Zsh(p)
		checkShell(t, "bash", p.Name, sh)
		checkShell(t, "zsh", ZshFile(p.Name), zsh)
	}
}

// checkShell has shell (bash or zsh) parse script without running it.
func checkShell(t *testing.T, shell, name, script string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(need(t, shell), "-n", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("%s -n %s: %v\n%s", shell, name, err, out)
	}
}

// complete sources the bash script in a bash of its own and returns what
// it offers for words, the last of which is being completed.
func complete(t *testing.T, script, program string, words ...string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), program)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"model.yaml", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// COMP_WORDS from the arguments, the completion function by name.
	cmd := exec.Command(need(t, "bash"), "--norc", "--noprofile", "-c",
		`source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); `+funcName(program)+`; printf '%s\n' "${COMPREPLY[@]}"`,
		"bash", path)
	cmd.Args = append(cmd.Args, words...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("completing %q: %v\n%s", words, err, out)
	}
	got := strings.Fields(string(out))
	slices.Sort(got)
	return got
}

func TestBashCompletes(t *testing.T) {
	ctl, _ := Bash(sampleProgram)
	run, _ := Bash(sampleLauncher)
	d, _ := Bash(sampleFlagsOnly)
	for _, tc := range []struct {
		name, script, program string
		words                 []string
		want                  []string
	}{
		{"a command", ctl, "tool-ctl", []string{"dr"}, []string{"drain"}},
		{"every command", ctl, "tool-ctl", []string{""}, []string{"check", "drain", "help", "shutdown", "status"}},
		{"a global flag", ctl, "tool-ctl", []string{"--v"}, []string{"--version"}},
		{"a command after a global flag's value", ctl, "tool-ctl", []string{"--socket", "/x", "sh"}, []string{"shutdown"}},
		{"a command's flags", ctl, "tool-ctl", []string{"status", "-"}, []string{"--group", "--json", "-o"}},
		{"a command's flag after its value", ctl, "tool-ctl", []string{"status", "--group", "a", "--j"}, []string{"--json"}},
		{"no guess at a value", ctl, "tool-ctl", []string{"status", "--group", ""}, nil},
		{"a file value", ctl, "tool-ctl", []string{"--socket", "mo"}, []string{"model.yaml"}},
		{"file arguments", ctl, "tool-ctl", []string{"check", "no"}, []string{"notes.txt"}},
		{"command arguments", ctl, "tool-ctl", []string{"help", "st"}, []string{"status"}},
		{"a launcher flag", run, "tool-run", []string{"--s"}, []string{"--sm", "--socket"}},
		{"a launcher flag's value", run, "tool-run", []string{"--sm", ""}, nil},
		{"the command", run, "tool-run", []string{"--sm", "30", "--", "bas"}, []string{"bash"}},
		{"the command without --", run, "tool-run", []string{"--quiet", "bas"}, []string{"bash"}},
		{"the command's arguments", run, "tool-run", []string{"bash", "mo"}, []string{"model.yaml"}},
		{"flags only", d, "toold", []string{"--s"}, []string{"--simulate"}},
		{"flags only, a file", d, "toold", []string{"--config", "mo"}, []string{"model.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := complete(t, tc.script, tc.program, append([]string{tc.program}, tc.words...)...)
			// compgen -c may offer more commands that start alike (bashbug).
			if tc.name == "the command" || tc.name == "the command without --" {
				if !slices.Contains(got, "bash") {
					t.Errorf("offers %q, want bash among them", got)
				}
				return
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("offers %q, want %q", got, tc.want)
			}
		})
	}
}
