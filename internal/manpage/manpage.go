package manpage

import (
	"fmt"
	"strings"
	"unicode"
)

// Page is one manual page. Every text is plain (no troff, no markup);
// Render escapes it.
type Page struct {
	// Name is the page's name, Section its section: "mpsctl", "8".
	Name, Section string
	// Source is the footer's left part (the project, with its version
	// when known); Manual the header's middle ("System Manager's
	// Manual"). Neither has a date, so the same definitions always give
	// the same page.
	Source, Manual string
	// Summary is the NAME line after the dash: what the program is, in
	// a few words.
	Summary string
	// Synopsis holds the forms of the command line, one per entry, each
	// styled by Styled; runs of white space (a usage text's wrapping and
	// indentation) are one space.
	Synopsis []string
	// Sections follow SYNOPSIS in order: DESCRIPTION, OPTIONS, ...
	Sections []Section
	// SeeAlso names other pages: "mps-launch(1)".
	SeeAlso []string
}

// Section is one .SH of a page.
type Section struct {
	// Title is written in capitals: "EXIT STATUS".
	Title  string
	Blocks []Block
}

// Block is a paragraph of a section: filled text, a tagged paragraph
// when Tag is set (.TP: the tag on its line, the text indented below),
// or lines shown as they are when Literal.
type Block struct {
	// Tag is styled by Styled: "--sm PCT", "status [-o FORMAT]".
	Tag string
	// Text is the paragraph. Filled text is reflowed: its line breaks
	// are spaces, and a blank line starts another paragraph. A Literal
	// block keeps its lines.
	Text    string
	Literal bool
	// Nested blocks follow Text, indented under it (.RS/.RE): a
	// command's flags under the command.
	Nested []Block
}

// Para is a block of filled text.
func Para(text string) Block { return Block{Text: text} }

// Item is a tagged paragraph.
func Item(tag, text string) Block { return Block{Tag: tag, Text: text} }

// Render writes p in troff with the man(7) macros.
func Render(p Page) string {
	var b strings.Builder
	fmt.Fprintf(&b, ".\\\" %s(%s): generated from the program's own definitions; do not edit.\n", p.Name, p.Section)
	fmt.Fprintf(&b, ".TH %s %s \"\" %s %s\n", quoteArg(strings.ToUpper(p.Name)), quoteArg(p.Section), quoteArg(p.Source), quoteArg(p.Manual))
	// Flags and paths read best unbroken: no hyphenation, a ragged right
	// margin.
	b.WriteString(".nh\n.ad l\n")
	b.WriteString(".SH NAME\n")
	b.WriteString(escapeLine(p.Name+" - "+p.Summary, false) + "\n")
	if len(p.Synopsis) > 0 {
		b.WriteString(".SH SYNOPSIS\n")
		for i, form := range p.Synopsis {
			if i > 0 {
				b.WriteString(".br\n")
			}
			b.WriteString(lineStart(Styled(strings.Join(strings.Fields(form), " "))) + "\n")
		}
	}
	for _, s := range p.Sections {
		fmt.Fprintf(&b, ".SH %s\n", quoteArg(strings.ToUpper(s.Title)))
		for i, bl := range s.Blocks {
			writeBlock(&b, bl, i == 0)
		}
	}
	if len(p.SeeAlso) > 0 {
		b.WriteString(".SH SEE ALSO\n")
		for i, ref := range p.SeeAlso {
			name, sec, ok := strings.Cut(strings.TrimSuffix(ref, ")"), "(")
			sep := ","
			if i == len(p.SeeAlso)-1 {
				sep = ""
			}
			if !ok {
				b.WriteString(escapeLine(ref+sep, false) + "\n")
				continue
			}
			fmt.Fprintf(&b, ".BR %s (%s)%s\n", quoteArg(name), escapeText(sec), sep)
		}
	}
	return b.String()
}

func writeBlock(b *strings.Builder, bl Block, first bool) {
	switch {
	case bl.Tag != "":
		b.WriteString(".TP\n" + lineStart(Styled(bl.Tag)) + "\n")
	case !first:
		b.WriteString(".PP\n")
	}
	if bl.Literal {
		b.WriteString(".nf\n")
		for _, l := range strings.Split(strings.TrimRight(bl.Text, "\n"), "\n") {
			b.WriteString(escapeLine(l, true) + "\n")
		}
		b.WriteString(".fi\n")
		return
	}
	defer func() {
		if len(bl.Nested) == 0 {
			return
		}
		b.WriteString(".RS\n")
		for i, n := range bl.Nested {
			writeBlock(b, n, i == 0 && bl.Text == "")
		}
		b.WriteString(".RE\n")
	}()
	for i, para := range paragraphs(bl.Text) {
		switch {
		case i == 0:
		case bl.Tag != "":
			b.WriteString(".IP\n") // the next paragraph of the tag's text
		default:
			b.WriteString(".PP\n")
		}
		for _, l := range Wrap(para, 72) {
			b.WriteString(escapeLine(l, false) + "\n")
		}
	}
}

// paragraphs splits text at blank lines into paragraphs of single-spaced
// words.
func paragraphs(text string) []string {
	var out []string
	for _, p := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		if f := strings.Fields(p); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// Wrap breaks s at spaces into lines of at most width bytes (a longer
// word stands alone): for a readable troff source (troff fills them
// again), and for the usage texts of the programs the pages describe.
func Wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) > width:
			lines = append(lines, line)
			line = w
		default:
			line += " " + w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// escapeText escapes plain text for a troff text line: a backslash is
// \e, every dash \- (a minus, so options copy as typed), and a rune
// beyond ASCII its \[uXXXX] (the page needs no input encoding).
func escapeText(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\e`)
		case r == '-':
			b.WriteString(`\-`)
		case r > unicode.MaxASCII:
			fmt.Fprintf(&b, `\[u%04X]`, r)
		case r < ' ' && r != '\t':
			// Control characters have no place in a page.
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// escapeLine is escapeText for a whole input line: one that would start
// with a dot or a quote (a request) starts with \& instead. In a literal
// line, leading spaces are kept.
func escapeLine(s string, literal bool) string {
	if !literal {
		s = strings.TrimSpace(s)
	}
	if s == "" {
		if literal {
			return `\&`
		}
		return ""
	}
	return lineStart(escapeText(s))
}

// lineStart protects an escaped line that would start with a dot or a
// quote, which troff reads as a request.
func lineStart(s string) string {
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		return `\&` + s
	}
	return s
}

// quoteArg is s as one argument of a macro: escaped, and in double
// quotes (a quote inside is \(dq).
func quoteArg(s string) string {
	return `"` + strings.ReplaceAll(escapeText(s), `"`, `\(dq`) + `"`
}

// Styled is s escaped, with fonts as a synopsis shows them: words that
// are written as typed (flags, commands, literal values) bold, words in
// capitals (placeholders: FILE, PCT, COMMAND) italic, punctuation ([ ] |
// ... , = and spaces) roman. "--sm PCT" is \fB\-\-sm\fR \fIPCT\fR.
func Styled(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i := 0; i < len(rs); {
		if !isWordRune(rs[i]) || (rs[i] == '.' && i+1 < len(rs) && rs[i+1] == '.') {
			// Punctuation, or an ellipsis.
			j := i + 1
			if rs[i] == '.' {
				for j < len(rs) && rs[j] == '.' {
					j++
				}
			}
			b.WriteString(escapeText(string(rs[i:j])))
			i = j
			continue
		}
		j := i
		for j < len(rs) && isWordRune(rs[j]) && !(rs[j] == '.' && j+1 < len(rs) && rs[j+1] == '.') {
			j++
		}
		word := string(rs[i:j])
		font := `\fB`
		if isPlaceholder(word) {
			font = `\fI`
		}
		b.WriteString(font + escapeText(word) + `\fR`)
		i = j
	}
	return b.String()
}

// isWordRune: letters, digits and what flags, paths and values contain.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("-_./$+%:@", r)
}

// isPlaceholder: a word with capitals and no small letters (FILE,
// G1, $MPSD_SOCKET is not one: it starts with $).
func isPlaceholder(w string) bool {
	if strings.HasPrefix(w, "-") || strings.HasPrefix(w, "$") {
		return false
	}
	upper := false
	for _, r := range w {
		if unicode.IsLower(r) {
			return false
		}
		if unicode.IsUpper(r) {
			upper = true
		}
	}
	return upper
}
