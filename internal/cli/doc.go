// Package cli is what mpsd, mps-launch and mpsctl share of their command
// lines: the wording of a flag error (package flag's, reworded for
// double-dash flags), the "did you mean" of a mistyped command or flag
// (Suggest, by edit distance), and the flag list of a usage text
// (FlagTable), so the three tools say the same thing the same way.
//
// It owns no state, does no I/O beyond writing the text it is given a
// writer for, and never logs or exits: each tool decides what to print
// and with which status.
package cli
