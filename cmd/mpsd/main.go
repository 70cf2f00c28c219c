// Command mpsd is the daemon that shares a host's GPUs through CUDA MPS:
// `mpsd --config /etc/mpsd/mpsd.yaml`, or `mpsd --simulate` on any Linux
// machine. Everything is in package mpsd; see docs/architecture.md. Under systemd it
// runs as a Type=notify service with a socket-activated API socket
// (examples/systemd/).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpsd/mpsd/mpsd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The first SIGTERM or SIGINT stops mpsd cleanly (STOPPING=1, state
	// saved, MPS daemons and workloads left running); once it has, the
	// signals get their default action again, so a second one ends a stop
	// that hangs.
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(mpsd.Main(ctx, os.Args[1:], os.Stderr))
}
