// Package mps drives and watches one NVIDIA MPS control daemon
// (nvidia-cuda-mps-control): start, adopt, typed commands with deadlines,
// stop with escalation, health probes and an event stream of daemon and
// server lifecycle. It is the only package of the daemon that runs the MPS
// binaries, and it drives the real ones and the emulator identically.
package mps
