// Package policy owns the configuration (schema version 1, strict decoding,
// validation, hot reload, diffs) and the pure admission decisions: who may
// use which group, whether a request can ever fit or fits now, where it is
// placed, and which queued request goes next.
//
// The decisions do no I/O and do not log; the daemon applies them.
package policy
