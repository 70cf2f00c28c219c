// Package gpusel is the project's one grammar of GPU selectors, the entries
// of a group's `gpus:` list and of the device flags:
//
//	all                                      every GPU of the host
//	3                                        the GPU with NVML index 3
//	GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d a full UUID
//	GPU-1a2b, 1a2b                           a UUID prefix matching exactly one GPU
//
// Entries made only of digits are indexes; a UUID prefix that is all digits
// is written with "GPU-". Matching is case-insensitive. MIG device UUIDs are
// refused: mpsd shares whole GPUs.
//
// The package owns parsing one entry (Parse) or a list (ParseList, which
// reports every bad entry at once) and resolving selectors against an
// inventory of index and UUID pairs (Selector.Resolve, Resolve), with
// errors that say which entry failed and why: ErrSyntax, ErrEmptyList,
// ErrUnknownIndex, ErrNoMatch and ErrAmbiguous, carried by *Error so each
// caller can word them its own way.
//
// It exists so that gpu/ (which wraps NVML through cgo) and policy/ (which
// must stay pure) read selectors identically without policy importing gpu.
// It is therefore a leaf: it imports only the standard library, never uses
// cgo, does no I/O, keeps no state and never logs. It does not decide which
// selectors a caller allows together (policy's "all alone", duplicate
// entries) and does not trim space around entries; callers that accept
// hand-typed padding trim it first.
package gpusel
