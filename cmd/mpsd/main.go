// Command mpsd is the daemon that shares a host's GPUs through CUDA MPS:
// `mpsd --config /etc/mpsd/mpsd.yaml`, or `mpsd --simulate` on any Linux
// machine. Everything is in package mpsd; see DESIGN.md.
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
	os.Exit(mpsd.Main(ctx, os.Args[1:], os.Stderr))
}
