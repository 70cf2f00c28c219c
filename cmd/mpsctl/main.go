// Command mpsctl is the operator's command line for mpsd: `mpsctl status`,
// `mpsctl drain --gpu 0`, `mpsctl restart --group inference`,
// `mpsctl check-config /etc/mpsd/mpsd.yaml`.
// Everything is in package internal/mpsctl; see its documentation and
// docs/architecture.md#processes for the commands, and `mpsctl help` for their flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpsd/mpsd/internal/mpsctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := mpsctl.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Environ())
	stop()
	os.Exit(code)
}
