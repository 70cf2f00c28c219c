// Package conformance checks the MPS emulator against NVIDIA's real
// nvidia-cuda-mps-control. Each scenario is a script of steps (start a
// daemon, send commands, kill processes, wait for log lines) that runs once
// against a real daemon of one driver generation, with the emulator's server
// as the stand-in server it spawns, and once against the emulator in that
// generation's mode. The transcripts (stdout, stderr and exit code of every
// call, pipe-directory listings, pid file, control.log and server.log with
// pids and timestamps normalised) must be identical.
//
// Allowed differences are the ones a GPU-less real daemon cannot show; a step
// that touches them carries the reason and is reported, not failed:
//   - A server's state: the real daemon never hears from the stand-in server,
//     so its servers stay INITIALIZING; the emulated daemon's servers become
//     ACTIVE (and FAULT), as real MPS does on a GPU. Commands whose output
//     depends on that state (get_server_status of a live server, the
//     per-server set/get_active_thread_percentage, get_client_list,
//     terminate_client) and the log lines a ready server produces
//     (NEW SERVER ... Ready) are GPU-only.
//   - CUDA clients: a real client needs a GPU, so client connections exist
//     only in the emulator.
package conformance
