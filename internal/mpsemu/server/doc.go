// Package server is the emulated nvidia-cuda-mps-server: one MPS server
// process that owns the emulated GPUs of its control daemon and serves
// emulated CUDA clients (mpsemu-client) over emuwire.
//
// It owns the server side of MPS's data path: the INITIALIZING → ACTIVE →
// FAULT → ACTIVE state machine, admission (at most MaxClients clients per
// device, 48 as on Volta and newer; 807 while FAULT), the limits a client
// gets (the server's active thread percentage and pinned memory limits,
// which the client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower), allocation accounting
// against them, fault containment (a fatal fault reported by one client is
// reported to every client; new clients are refused until all of those have
// exited) and terminate_client.
//
// When an emulated daemon runs on the same pipe directory the server
// registers with it (the daemon then reports it ACTIVE and configures its
// defaults). Spawned by NVIDIA's daemon, which it cannot talk to, it serves
// clients on its own and the real daemon keeps calling it INITIALIZING.
// It writes server.log lines through the pipe directory's log FIFO when a
// daemon has one open.
//
// It never spawns processes and never touches the pipe directory's files.
package server
