// Package manpage renders the manual pages and the shell completion
// scripts of mpsd, mps-launch and mpsctl from the programs' own
// definitions: a Page (its sections, tagged paragraphs and synopsis
// forms, plain text) becomes troff with the man(7) macros, and a Program
// (its flags and commands) becomes a bash or a zsh completion script.
// The packages that own the definitions (internal/mpsctl, launcher,
// cmd/mpsd, policy) build the Page and the Program; their tests compare
// what this package renders with the files committed under docs/man and
// docs/completion (package manpagetest), so a flag or a key added without
// its page fails a test.
//
// It owns the escaping: text is always plain and is escaped here
// (backslashes, dashes, a line's leading dot or quote, non-ASCII runes),
// and the fonts of a synopsis or a tag follow one rule (Styled): literal
// words bold, CAPITALIZED placeholders italic, punctuation roman.
//
// It never reads or writes files, runs programs or logs: it returns text.
package manpage
