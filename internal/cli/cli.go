package cli

import (
	"bytes"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
)

// Distance is the edit distance between a and b in characters: the
// fewest insertions, deletions, substitutions and swaps of two adjacent
// characters that turn one into the other ("drian" is 1 from "drain").
func Distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	// d[i][j]: the distance between x[:i] and y[:j].
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// Suggest returns the name of known closest to got, if one is close
// enough to be what was meant: within a third of got's length (at least
// one edit, at most three), or one that got is a prefix of when that
// prefix names only it. "" when none is, or when two are equally close.
func Suggest(got string, known []string) string {
	if got == "" {
		return ""
	}
	var prefixed []string
	for _, k := range known {
		if strings.HasPrefix(k, got) {
			prefixed = append(prefixed, k)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	limit := min(max(len([]rune(got))/3, 1), 3)
	best, bestD, tie := "", limit+1, false
	for _, k := range known {
		switch d := Distance(got, k); {
		case d < bestD:
			best, bestD, tie = k, d, false
		case d == bestD && k != best:
			tie = true
		}
	}
	if tie {
		return ""
	}
	return best
}

// UnknownCommand is the error text of a command name that is none of
// known: `unknown command "drian"; did you mean "drain"?`.
func UnknownCommand(name string, known []string) string {
	msg := fmt.Sprintf("unknown command %q", name)
	if s := Suggest(name, known); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	return msg
}

// UnknownFlag is the error text of a flag that is none of known (names
// without dashes): "unknown flag --jsno; did you mean --json?". name may
// carry its dashes and a "=value", which are left out.
func UnknownFlag(name string, known []string) string {
	name, _, _ = strings.Cut(strings.TrimLeft(name, "-"), "=")
	msg := "unknown flag --" + name
	if s := Suggest(name, known); s != "" {
		msg += "; did you mean --" + s + "?"
	}
	return msg
}

// FlagNames lists the flags fs defines, sorted.
func FlagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	slices.Sort(names)
	return names
}

// FlagError rewords an error of fs.Parse for double-dash flags: "unknown
// flag --jsno; did you mean --json?" (the suggestion from fs's flags),
// "flag --gpu needs an argument", `invalid value "x" for flag --sm: ...`.
func FlagError(err error, fs *flag.FlagSet) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return UnknownFlag(name, FlagNames(fs))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "flag --" + name + " needs an argument"
	}
	if strings.Contains(msg, " for flag -") {
		return strings.Replace(msg, " for flag -", " for flag --", 1)
	}
	return strings.Replace(msg, " for -", " for --", 1)
}

// IsUnknown reports whether a message of UnknownCommand or UnknownFlag
// (or FlagError's for an undefined flag) is about a name that does not
// exist: the tools print a short hint after it instead of their usage.
func IsUnknown(msg string) bool {
	return strings.Contains(msg, "unknown command ") || strings.Contains(msg, "unknown flag --")
}

// Dashes is a flag's name as the tools write it: "-o" for a one-letter
// flag, "--json" for the others (package flag takes either form).
func Dashes(name string) string {
	if len([]rune(name)) == 1 {
		return "-" + name
	}
	return "--" + name
}

// FlagTable is the "Flags:" part of a usage text: one line per flag of
// fs, in name order, "  --name ARG  usage" ("-o ARG" for a one-letter
// name), ARG taken from a back-quoted
// word of the usage as package flag's does; a boolean flag has none, or
// "[ARG]" when its usage names one (a flag whose value is optional).
// Empty when fs has no flags.
func FlagTable(fs *flag.FlagSet) string {
	var lines [][2]string
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if b, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool && b.IsBoolFlag() && arg != "" {
			arg = "[" + arg + "]"
		}
		lines = append(lines, [2]string{strings.TrimSpace(Dashes(f.Name) + " " + arg), usage})
	})
	if len(lines) == 0 {
		return ""
	}
	var b bytes.Buffer
	b.WriteString("Flags:\n")
	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	for _, l := range lines {
		fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
	}
	_ = tw.Flush()
	return b.String()
}
