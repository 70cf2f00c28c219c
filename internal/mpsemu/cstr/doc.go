// Package cstr reproduces the C library's number and token scanning exactly
// as NVIDIA's nvidia-cuda-mps-control applies it to command arguments
// (sscanf "%d"/"%u"/"%s", strtod, strtoull), and MPS's loose pinned-memory
// size syntax. The emulator must accept, truncate and wrap input the way the
// real daemon does ("12abc" is 12, "99999999999" is 1215752191, "3T" is
// 3 MiB), so these functions copy glibc's behaviour on LP64 Linux rather than
// Go's strconv rules.
//
// It owns parsing and formatting only; it never logs, allocates resources or
// reads the environment.
package cstr
