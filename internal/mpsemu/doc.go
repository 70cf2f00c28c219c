// Package mpsemu is the MPS emulator: stand-ins for nvidia-cuda-mps-control,
// nvidia-cuda-mps-server and a CUDA client (mpsemu-client) that behave like
// NVIDIA's MPS closely enough that the daemon's tests mean something. They
// drop in through PATH or configuration; no code path of mpsd knows it is
// talking to them.
package mpsemu
