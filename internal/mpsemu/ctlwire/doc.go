// Package ctlwire speaks NVIDIA's control-socket protocol: the framing that
// nvidia-cuda-mps-control uses between its client mode and its daemon over
// the SOCK_SEQPACKET sockets "control" and "control_privileged" in the pipe
// directory. The layout was read off the real binaries with strace:
//
//	daemon → client  "OUTBHELL\x00"                          (greeting)
//	client → daemon  "OUTBCRED\x00" + SCM_CREDENTIALS         (who is asking)
//	client → daemon  uint32 connection kind (4 = user interface)
//	client → daemon  uint64 length, then the line + "\x00"    (one command)
//	client → daemon  uint64 0                                 (end of input)
//	daemon → client  uint32 0 + text                          (one output line)
//	daemon → client  uint32 1 + uint32 status                 (end of session)
//
// All integers are little-endian. Because the emulator speaks the same
// protocol, its client works against NVIDIA's daemon and NVIDIA's client
// against the emulated daemon.
//
// The package owns framing and credentials only; what commands mean is the
// control package's business. It never logs.
package ctlwire
