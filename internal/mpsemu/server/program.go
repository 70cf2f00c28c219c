package server

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Main is the nvidia-cuda-mps-server program: it serves until SIGINT (what
// MPS's daemon sends on shutdown_server -f and quit -t) or SIGTERM, or until
// a shutdown the daemon requested completes, and exits 0.
// MPSEMU_SERVER_IGNORE_SIGINT=1 makes it ignore SIGINT, like a server stuck
// in the GPU, so tests can show that MPS never escalates.
// MPSEMU_SERVER_FAIL_INIT=DURATION makes it exit 1 after DURATION without
// serving, like a server whose GPU initialisation fails (MPS's daemon then
// starts it again while clients wait: a crash loop).
func Main(getenv func(string) string, stderr io.Writer) int {
	if v := getenv("MPSEMU_SERVER_FAIL_INIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			fmt.Fprintf(stderr, "nvidia-cuda-mps-server: MPSEMU_SERVER_FAIL_INIT=%q: want a duration\n", v)
			return 1
		}
		time.Sleep(d) // the emulated initialisation that fails
		fmt.Fprintln(stderr, "nvidia-cuda-mps-server: initialisation failed (MPSEMU_SERVER_FAIL_INIT)")
		return 1
	}
	sigs := []os.Signal{syscall.SIGTERM}
	if getenv("MPSEMU_SERVER_IGNORE_SIGINT") == "1" {
		signal.Ignore(os.Interrupt)
	} else {
		sigs = append(sigs, os.Interrupt)
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-server: %v\n", err)
		return 1
	}
	if err := New(cfg).Run(ctx); err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-server: %v\n", err)
		return 1
	}
	return 0
}
