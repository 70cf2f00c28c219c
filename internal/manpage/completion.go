package manpage

import (
	"fmt"
	"strings"
)

// Program is what a completion script knows of a program's command line.
type Program struct {
	// Name is the program as typed: "mpsctl".
	Name string
	// Flags are the flags before a command (every flag of a program
	// without commands), "--help" among them where the program takes it.
	Flags []Flag
	// Commands are named by the first argument that is no flag; each
	// takes its own flags after its name.
	Commands []Command
	// RunsCommand: the first argument that is no flag, or the one after
	// "--", starts a command line that the program runs (mps-launch):
	// it completes as a command of its own.
	RunsCommand bool
}

// Flag is one flag of a program or a command.
type Flag struct {
	// Name is without dashes; a one-letter name is written -o, others
	// --name.
	Name string
	// Arg is the value's placeholder ("FILE", "PCT"), "" for a flag
	// without a value. FILE, PATH and SOCKET complete file names, DIR
	// directories; others nothing.
	Arg string
	// Usage is one line on what the flag does.
	Usage string
}

// Dashed is the flag as typed: "-o", "--json".
func (f Flag) Dashed() string {
	if len([]rune(f.Name)) == 1 {
		return "-" + f.Name
	}
	return "--" + f.Name
}

// Args says what a command's positional arguments are.
type Args int

const (
	// NoArgs: nothing to complete (IDs, numbers).
	NoArgs Args = iota
	// FileArgs: file names.
	FileArgs
	// CommandArgs: the program's command names (help COMMAND).
	CommandArgs
)

// Command is one command of a program with commands (mpsctl's).
type Command struct {
	Name, Summary string
	Flags         []Flag
	Args          Args
}

// isName says whether s may name a program, command or flag: letters,
// digits, '-' and '_', not starting with '-' or '_' (the scripts write
// names unquoted in case patterns).
func isName(s string) bool {
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case (r == '-' || r == '_') && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

// Check says what in p a script cannot carry: a name other than letters,
// digits, '-' and '_', or a name given twice.
func Check(p Program) error {
	var problems []string
	checkFlags := func(where string, fs []Flag) {
		seen := map[string]bool{}
		for _, f := range fs {
			if !isName(f.Name) {
				problems = append(problems, fmt.Sprintf("%sflag %q: not a name", where, f.Name))
			}
			if seen[f.Name] {
				problems = append(problems, fmt.Sprintf("%sflag %q: given twice", where, f.Name))
			}
			seen[f.Name] = true
		}
	}
	if !isName(p.Name) {
		problems = append(problems, fmt.Sprintf("program %q: not a name", p.Name))
	}
	checkFlags("", p.Flags)
	seen := map[string]bool{}
	for _, c := range p.Commands {
		if !isName(c.Name) {
			problems = append(problems, fmt.Sprintf("command %q: not a name", c.Name))
		}
		if seen[c.Name] {
			problems = append(problems, fmt.Sprintf("command %q: given twice", c.Name))
		}
		seen[c.Name] = true
		checkFlags("command "+c.Name+": ", c.Flags)
	}
	if len(problems) > 0 {
		return fmt.Errorf("manpage: %s: %s", p.Name, strings.Join(problems, "; "))
	}
	return nil
}

// funcName is the completion function of program n.
func funcName(n string) string { return "_" + strings.ReplaceAll(n, "-", "_") }

// header is the comment a script starts with.
func header(shell, prog string) string {
	return fmt.Sprintf("# %s completion for %s: generated from %s's own definitions by make man; do not edit.\n", shell, prog, prog)
}

// valueFlags are the dashed forms of fs's flags that take a value, as
// one case pattern ("--socket|-socket"; package flag takes one dash too).
func valueFlags(fs []Flag, kind func(Flag) bool) string {
	var alts []string
	for _, f := range fs {
		if f.Arg != "" && kind(f) {
			alts = append(alts, f.Dashed())
			if len(f.Name) > 1 {
				alts = append(alts, "-"+f.Name)
			} else {
				alts = append(alts, "--"+f.Name)
			}
		}
	}
	return strings.Join(alts, "|")
}

func isFileArg(f Flag) bool { return f.Arg == "FILE" || f.Arg == "PATH" || f.Arg == "SOCKET" }
func isDirArg(f Flag) bool  { return f.Arg == "DIR" }
func isOtherArg(f Flag) bool {
	return !isFileArg(f) && !isDirArg(f)
}

func dashedList(fs []Flag) string {
	var s []string
	for _, f := range fs {
		s = append(s, f.Dashed())
	}
	return strings.Join(s, " ")
}

// bashValue writes the case that completes the value of a flag in fs
// named by $prev, and returns.
func bashValue(b *strings.Builder, indent string, fs []Flag) {
	var arms []string
	if p := valueFlags(fs, isFileArg); p != "" {
		arms = append(arms, p+`) COMPREPLY=($(compgen -f -- "$cur")); return ;;`)
	}
	if p := valueFlags(fs, isDirArg); p != "" {
		arms = append(arms, p+`) COMPREPLY=($(compgen -d -- "$cur")); return ;;`)
	}
	if p := valueFlags(fs, isOtherArg); p != "" {
		arms = append(arms, p+`) return ;; # a value to type: nothing to offer`)
	}
	if len(arms) == 0 {
		return
	}
	b.WriteString(indent + "case $prev in\n")
	for _, a := range arms {
		b.WriteString(indent + a + "\n")
	}
	b.WriteString(indent + "esac\n")
}

// Bash is p's bash completion script: source it, or install it as
// /usr/share/bash-completion/completions/NAME.
func Bash(p Program) (string, error) {
	if err := Check(p); err != nil {
		return "", err
	}
	fn := funcName(p.Name)
	var b strings.Builder
	b.WriteString(header("bash", p.Name))
	fmt.Fprintf(&b, "\n%s() {\n", fn)
	b.WriteString("\tlocal cur=${COMP_WORDS[COMP_CWORD]} prev=\n")
	b.WriteString("\t((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}\n")
	b.WriteString("\tCOMPREPLY=()\n")
	if vf := valueFlags(p.Flags, func(Flag) bool { return true }); len(p.Commands) > 0 || p.RunsCommand {
		// Find the command (or the command line) among the words
		// before the cursor, skipping the flags' values.
		b.WriteString("\tlocal i at=0\n")
		b.WriteString("\tfor ((i = 1; i < COMP_CWORD; i++)); do\n")
		b.WriteString("\t\tcase ${COMP_WORDS[i]} in\n")
		if vf != "" {
			b.WriteString("\t\t" + vf + ") i=$((i + 1)) ;;\n")
		}
		if p.RunsCommand {
			b.WriteString("\t\t--) at=$((i + 1)); break ;;\n")
		}
		b.WriteString("\t\t-*) ;;\n")
		b.WriteString("\t\t*) at=$i; break ;;\n")
		b.WriteString("\t\tesac\n")
		b.WriteString("\tdone\n")
	}
	switch {
	case p.RunsCommand:
		b.WriteString("\tif ((at > 0 && at < COMP_CWORD)); then\n")
		b.WriteString("\t\t# The command line: complete it as its own program's.\n")
		b.WriteString("\t\tif declare -F _command_offset >/dev/null; then\n")
		b.WriteString("\t\t\t_command_offset \"$at\"\n")
		b.WriteString("\t\telse\n")
		b.WriteString("\t\t\tCOMPREPLY=($(compgen -f -- \"$cur\"))\n")
		b.WriteString("\t\tfi\n")
		b.WriteString("\t\treturn\n")
		b.WriteString("\tfi\n")
		b.WriteString("\tif ((at == COMP_CWORD)); then\n")
		b.WriteString("\t\tCOMPREPLY=($(compgen -c -- \"$cur\"))\n")
		b.WriteString("\t\treturn\n")
		b.WriteString("\tfi\n")
		bashValue(&b, "\t", p.Flags)
		b.WriteString("\tcase $cur in\n")
		fmt.Fprintf(&b, "\t-*) COMPREPLY=($(compgen -W %s -- \"$cur\")) ;;\n", shellQuote(dashedList(p.Flags)))
		b.WriteString("\t*) COMPREPLY=($(compgen -c -- \"$cur\")) ;;\n")
		b.WriteString("\tesac\n")
	case len(p.Commands) > 0:
		var names []string
		for _, c := range p.Commands {
			names = append(names, c.Name)
		}
		b.WriteString("\tif ((at == 0)); then\n")
		bashValue(&b, "\t\t", p.Flags)
		b.WriteString("\t\tcase $cur in\n")
		fmt.Fprintf(&b, "\t\t-*) COMPREPLY=($(compgen -W %s -- \"$cur\")) ;;\n", shellQuote(dashedList(p.Flags)))
		fmt.Fprintf(&b, "\t\t*) COMPREPLY=($(compgen -W %s -- \"$cur\")) ;;\n", shellQuote(strings.Join(names, " ")))
		b.WriteString("\t\tesac\n")
		b.WriteString("\t\treturn\n")
		b.WriteString("\tfi\n")
		b.WriteString("\tcase ${COMP_WORDS[at]} in\n")
		for _, c := range p.Commands {
			fmt.Fprintf(&b, "\t%s)\n", c.Name)
			if len(c.Flags) == 0 && c.Args == NoArgs {
				b.WriteString("\t\t;;\n")
				continue
			}
			bashValue(&b, "\t\t", c.Flags)
			b.WriteString("\t\tcase $cur in\n")
			if len(c.Flags) > 0 {
				fmt.Fprintf(&b, "\t\t-*) COMPREPLY=($(compgen -W %s -- \"$cur\")) ;;\n", shellQuote(dashedList(c.Flags)))
			}
			switch c.Args {
			case FileArgs:
				b.WriteString("\t\t*) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n")
			case CommandArgs:
				fmt.Fprintf(&b, "\t\t*) COMPREPLY=($(compgen -W %s -- \"$cur\")) ;;\n", shellQuote(strings.Join(names, " ")))
			}
			b.WriteString("\t\tesac\n")
			b.WriteString("\t\t;;\n")
		}
		b.WriteString("\tesac\n")
	default:
		bashValue(&b, "\t", p.Flags)
		fmt.Fprintf(&b, "\tCOMPREPLY=($(compgen -W %s -- \"$cur\"))\n", shellQuote(dashedList(p.Flags)))
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "complete -F %s %s\n", fn, p.Name)
	return b.String(), nil
}

// shellQuote is s as one single-quoted shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// zshSpec is f as one _arguments spec, single-quoted.
func zshSpec(f Flag) string {
	desc := strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`).Replace(strings.Join(strings.Fields(f.Usage), " "))
	spec := f.Dashed()
	if f.Arg != "" {
		if len(f.Name) == 1 {
			spec += "+"
		} else {
			spec += "="
		}
	}
	spec += "[" + desc + "]"
	if f.Arg != "" {
		action := " "
		switch {
		case isFileArg(f):
			action = "_files"
		case isDirArg(f):
			action = "_files -/"
		}
		spec += ":" + strings.ReplaceAll(f.Arg, ":", `\:`) + ":" + action
	}
	return shellQuote(spec)
}

// zshDescribe is a command's entry of _describe: "name:summary".
func zshDescribe(c Command) string {
	return shellQuote(c.Name + ":" + strings.Join(strings.Fields(c.Summary), " "))
}

// Zsh is p's zsh completion script: install it as _NAME in a directory
// of $fpath (it starts with #compdef), or source it after compinit.
func Zsh(p Program) (string, error) {
	if err := Check(p); err != nil {
		return "", err
	}
	fn := funcName(p.Name)
	var b strings.Builder
	fmt.Fprintf(&b, "#compdef %s\n", p.Name)
	b.WriteString(header("zsh", p.Name))
	fmt.Fprintf(&b, "\n%s() {\n", fn)
	writeSpecs := func(indent string, fs []Flag, extra ...string) {
		for _, f := range fs {
			b.WriteString(" \\\n" + indent + zshSpec(f))
		}
		for _, e := range extra {
			b.WriteString(" \\\n" + indent + e)
		}
		b.WriteString("\n")
	}
	switch {
	case p.RunsCommand:
		b.WriteString("\t_arguments -S -A '-*'")
		writeSpecs("\t\t", p.Flags, `'1:command:_command_names -e'`, `'*::arguments:_normal'`)
	case len(p.Commands) > 0:
		b.WriteString("\tlocal curcontext=$curcontext state line\n")
		b.WriteString("\ttypeset -A opt_args\n")
		b.WriteString("\tlocal -a commands\n")
		b.WriteString("\tcommands=(\n")
		for _, c := range p.Commands {
			b.WriteString("\t\t" + zshDescribe(c) + "\n")
		}
		b.WriteString("\t)\n")
		b.WriteString("\t_arguments -C")
		writeSpecs("\t\t", p.Flags, `'1: :->command'`, `'*:: :->args'`)
		b.WriteString("\tcase $state in\n")
		fmt.Fprintf(&b, "\tcommand) _describe -t commands %s commands ;;\n", shellQuote(p.Name+" command"))
		b.WriteString("\targs)\n")
		b.WriteString("\t\tcurcontext=${curcontext%:*:*}:" + p.Name + "-$words[1]:\n")
		b.WriteString("\t\tcase $words[1] in\n")
		for _, c := range p.Commands {
			fmt.Fprintf(&b, "\t\t%s)\n", c.Name)
			var extra []string
			switch c.Args {
			case FileArgs:
				extra = append(extra, `'*:file:_files'`)
			case CommandArgs:
				extra = append(extra, shellQuote(fmt.Sprintf("1:command:(%s)", commandWords(p.Commands))))
			}
			if len(c.Flags) == 0 && len(extra) == 0 {
				b.WriteString("\t\t\t_message 'no arguments'\n")
				b.WriteString("\t\t\t;;\n")
				continue
			}
			b.WriteString("\t\t\t_arguments")
			writeSpecs("\t\t\t\t", c.Flags, extra...)
			b.WriteString("\t\t\t;;\n")
		}
		b.WriteString("\t\tesac\n")
		b.WriteString("\t\t;;\n")
		b.WriteString("\tesac\n")
	default:
		b.WriteString("\t_arguments")
		writeSpecs("\t\t", p.Flags)
	}
	b.WriteString("}\n\n")
	b.WriteString("if [ \"$funcstack[1]\" = " + shellQuote(fn) + " ]; then\n")
	fmt.Fprintf(&b, "\t%s \"$@\"\n", fn)
	b.WriteString("else\n")
	fmt.Fprintf(&b, "\tcompdef %s %s\n", fn, p.Name)
	b.WriteString("fi\n")
	return b.String(), nil
}

func commandWords(cs []Command) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.Name)
	}
	return strings.Join(s, " ")
}

// ZshFile is the name of program n's zsh script in a directory of
// $fpath: "_mpsctl", "_mps_launch" (the function it defines).
func ZshFile(n string) string { return funcName(n) }
