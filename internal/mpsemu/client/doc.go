// Package client is mpsemu-client, the MPS emulator's stand-in for a CUDA
// application. It reads the MPS environment as the CUDA driver does
// (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), reaches a server through the emulated
// daemon (or, when NVIDIA's daemon runs, directly), prints the limits it was
// given on one line, and then allocates, runs, faults or fails as told.
//
// Two flags play a tenant's client that lies to MPS, for the daemon's
// security tests: --claim-pid PID tells the daemon and the server that
// the client is PID (a CUDA client reports its pid, and MPS lists what it
// was told: get_client_list then names PID, whatever process that is),
// and --setuid-after-connect UID becomes another uid once served.
//
// Output on success (stdout, one line, then one per allocation):
//
//	mpsemu-client: pid=4242 server=4240 sm=25.0 devices=2 mem0=8192M mem1=40960M
//	mpsemu-client: allocated 1073741824 bytes on device 0
//
// Every failure prints "mpsemu-client: CUDA error <n> <name>: <detail>" on
// stderr and exits with a code from this table:
//
//	exit  CUDA error
//	   0  none
//	   1  any other
//	   2  (usage: bad flag or value)
//	  12  2    cudaErrorMemoryAllocation       --alloc above the client's limit
//	  30  100  cudaErrorNoDevice               CUDA_VISIBLE_DEVICES selects none
//	  31  101  cudaErrorInvalidDevice          --device out of range
//	  70  700  cudaErrorIllegalAddress         a fatal fault on the server (own or another client's)
//	  85  805  cudaErrorMpsConnectionFailed    no daemon or server to connect to
//	  86  806  cudaErrorMpsRpcFailure          the server went away under the client
//	  87  807  cudaErrorMpsServerNotReady      server in FAULT, refusing new clients
//	  88  808  cudaErrorMpsMaxClientsReached   server full (48 per device)
//	  90  810  cudaErrorMpsClientTerminated    terminate_client
//	 130  SIGINT, 143 SIGTERM (128 + signal; the client exits at once)
//
// The package never spawns processes and never logs except these lines.
package client
