// Package mpslog owns MPS's log formats: the line format of control.log and
// server.log ("[YYYY-MM-DD HH:MM:SS.mmm Control %5d] message") and the
// binary records that MPS processes write into the daemon's "log" FIFO in the
// pipe directory, which the daemon turns into lines. The emulator uses the
// same record layout as NVIDIA's daemon, so a record written by one of them
// is logged correctly by the other.
//
// ReadRecord and Sink.Pump read the FIFO as NVIDIA's logger thread does,
// down to what a hostile writer gets out of it (any process that may open
// the FIFO): a record is rendered from its header's fields as written; a
// bad header stops the logger for good; a header declaring more text than
// will ever come swallows everything after it, the daemon's own records
// included, until about 6 KiB of it has come and the daemon dies
// (ErrOverrun; Room holds each generation's numbers). It never holds more
// than that of a record's text, whatever the header declares.
//
// It formats, encodes and decodes; it never decides what is logged, and it
// does not use log/slog: these are MPS's own files, byte for byte.
package mpslog
