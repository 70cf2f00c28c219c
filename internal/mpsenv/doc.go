// Package mpsenv builds the MPS environment of a lease's client in the one
// form MPS cannot misread, and checks an environment for the forms that
// make MPS run a client without its limits.
//
// MPS fails open without a word: a client whose
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names a device it cannot see (an
// ordinal past its devices, a UUID it does not see) drops every pinned
// limit, not just that entry, and one without CUDA_MPS_PIPE_DIRECTORY runs
// as a plain CUDA process with the whole GPU. So the environment is built
// only from the devices the client sees (Devices, made from the GPU UUIDs
// of the instance in the order its MPS server enumerates them):
//
//	CUDA_VISIBLE_DEVICES              GPU-aaaa,GPU-bbbb   every device by full UUID
//	CUDA_MPS_PINNED_DEVICE_MEM_LIMIT  0=8192M,1=8192M     one entry per visible device
//	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 30
//	CUDA_MPS_PIPE_DIRECTORY           /run/mpsd/…/pipe
//
// A lease whose share is divided among several client processes (mps-launch
// --procs N) gives each the thread percentage WorkerPercentage(sm, N),
// sm/N rounded down, so the N together stay within sm; CheckShare holds a
// client to it.
//
// The limit's keys are ordinals relative to CUDA_VISIBLE_DEVICES, the form
// every driver generation reads (UUID keys are documented only for newer
// ones); CUDA_VISIBLE_DEVICES names UUIDs, which mean the same device to
// the client as to the server that remaps the daemon's devices to 0..n-1
// (an index there is the server's, not the host's). Values are whole MiB,
// "NNNM": MPS reads any suffix but G as MiB.
package mpsenv
