// Package mpslog owns MPS's log formats: the line format of control.log and
// server.log ("[YYYY-MM-DD HH:MM:SS.mmm Control %5d] message") and the
// binary records that MPS processes write into the daemon's "log" FIFO in the
// pipe directory, which the daemon turns into lines. The emulator uses the
// same record layout as NVIDIA's daemon, so a record written by one of them
// is logged correctly by the other.
//
// It formats, encodes and decodes; it never decides what is logged, and it
// does not use log/slog: these are MPS's own files, byte for byte.
package mpslog
