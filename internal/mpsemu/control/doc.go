// Package control is the emulated nvidia-cuda-mps-control: NVIDIA's MPS
// control daemon (-d, -f) and its command-line client, byte for byte as the
// driver generation chosen by MPSEMU_DRIVER (535, 550, 555 or 580) behaves;
// without it, the generation of MPSEMU_DRIVER_VERSION's driver (the one a
// simulated GPU reports: 570.172.08 behaves as 555, 580.159.04 as 580), else
// 550.
//
// It owns the control daemon's whole observable surface: argument handling,
// daemonizing (Go cannot fork, so -d re-executes the program and waits on a
// readiness pipe), the pipe-directory files (control and
// control_privileged sockets, control_lock with its fcntl lock, the log
// FIFO, the pid file), control.log/server.log lines (its own written
// through the log FIFO behind anyone else's, as NVIDIA's are, so that a
// poisoned or stopped logger loses them too, and quit waits for the logger
// as NVIDIA's does), every control command with NVIDIA's parsing quirks
// and messages, and the server lifecycle: one server uid at a time,
// spawned from PATH as the client's uid, SIGINT and never SIGKILL on
// shutdown_server -f and quit -t, exit statuses as NVIDIA reports them,
// immediate restart for waiting clients.
//
// The client mode speaks NVIDIA's control protocol (package ctlwire), so
// it also drives a real daemon, and NVIDIA's client drives this one.
// Servers and CUDA clients reach the daemon over the emulator's private
// protocol (package emuwire), never through the pipe directory.
//
// It never kills a server with anything but SIGINT, never writes outside the
// pipe and log directories, and never logs through log/slog: its output is
// MPS's own.
package control
