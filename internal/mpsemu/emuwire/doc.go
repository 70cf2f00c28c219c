// Package emuwire is the emulator's private protocol between its control
// daemon, its server and its CUDA client stand-in: newline-delimited JSON
// messages over Linux abstract unix sockets. Real MPS uses a private
// protocol too (which nobody outside NVIDIA speaks); the emulator's lives on
// abstract sockets so the pipe directory holds exactly the files NVIDIA's
// daemon creates.
//
// Socket names derive from the absolute pipe directory through a hash, so
// they stay within the 108-byte sun_path limit for any directory:
//
//	@mpsemu-<hash>-daemon         the emulated control daemon
//	@mpsemu-<hash>-server-<pid>   one emulated server
//	@mpsemu-<hash>-server         the newest server (for clients of NVIDIA's daemon)
//
// The package owns names, message shapes and peer credentials; it never
// decides behaviour and never logs.
package emuwire
