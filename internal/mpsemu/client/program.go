package client

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpsd/mpsd/internal/mpsemu/server"
)

// Main is the mpsemu-client program; it returns the exit status (doc.go).
//
//	mpsemu-client [--alloc SIZE] [--device N] [--duration D] [--fault-after D] [--fault-on-usr1]
//	              [--hold-on-fault] [--setuid-after-connect UID] [--claim-pid PID]
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return MainEnv(args, func(k string) (string, bool) { v := getenv(k); return v, v != "" }, stdout, stderr)
}

// MainEnv is Main with a lookup that tells an empty variable from an
// unset one (CUDA_VISIBLE_DEVICES="" selects no device, unset all).
func MainEnv(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	getenv := func(k string) string { v, _ := lookup(k); return v }
	fs := flag.NewFlagSet("mpsemu-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	alloc := fs.String("alloc", "", "allocate `SIZE` (8G, 512M, 1.5G, bytes) on --device")
	device := fs.Int("device", 0, "device ordinal for --alloc")
	duration := fs.Duration("duration", 0, "stay connected this long after setup")
	faultAfter := fs.Duration("fault-after", 0, "raise a fatal GPU fault after this long")
	faultOnUSR1 := fs.Bool("fault-on-usr1", false, "raise a fatal GPU fault when SIGUSR1 arrives (once)")
	holdOnFault := fs.Bool("hold-on-fault", false, "stay connected for the rest of --duration after the server reports a fatal fault (MPS keeps the server in FAULT meanwhile)")
	setuid := fs.Int("setuid-after-connect", -1, "once connected, become `UID` (uid, gid and no groups; needs root): MPS then lists a process of that uid, which it never served")
	claim := fs.Int("claim-pid", 0, "tell the daemon and the server that the client is `PID` (a CUDA client reports its own pid, which MPS takes as told): MPS then lists that pid for this client")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *duration < 0 || *faultAfter < 0 || *claim < 0 {
		fmt.Fprintln(stderr, "mpsemu-client: unexpected arguments or negative duration")
		return 2
	}
	opts := Options{
		PipeDir:     getenv("CUDA_MPS_PIPE_DIRECTORY"),
		PID:         os.Getpid(),
		EnvSM:       getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
		EnvPinned:   getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
		AllocDevice: *device,
		Duration:    *duration,
		FaultAfter:  *faultAfter,
		HoldOnFault: *holdOnFault,
	}
	opts.EnvVisible, opts.HasVisible = lookup("CUDA_VISIBLE_DEVICES")
	if *claim > 0 {
		opts.PID = *claim
	}
	if uid := *setuid; uid >= 0 {
		opts.Connected = func() error {
			if err := syscall.Setgroups(nil); err != nil {
				return fmt.Errorf("setgroups: %w", err)
			}
			if err := syscall.Setgid(uid); err != nil {
				return fmt.Errorf("setgid %d: %w", uid, err)
			}
			if err := syscall.Setuid(uid); err != nil {
				return fmt.Errorf("setuid %d: %w", uid, err)
			}
			return nil
		}
	}
	if opts.PipeDir == "" {
		opts.PipeDir = "/tmp/nvidia-mps"
	}
	if *alloc != "" {
		b, err := server.ParseSize(*alloc)
		if err != nil {
			fmt.Fprintf(stderr, "mpsemu-client: --alloc: %v\n", err)
			return 2
		}
		opts.Alloc = b
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)
	var got os.Signal
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case got = <-sigc:
			cancel()
		case <-ctx.Done():
		}
	}()
	faultDone := make(chan struct{})
	if *faultOnUSR1 {
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		now := make(chan struct{}, 1)
		opts.FaultNow = now
		go func() {
			defer close(faultDone)
			for {
				select {
				case <-usr1:
					select {
					case now <- struct{}{}:
					default:
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	} else {
		close(faultDone)
	}
	err := Run(ctx, opts, stdout)
	cancel()
	<-watchDone
	<-faultDone

	var cerr *Error
	switch {
	case err == nil:
		return 0
	case got != nil:
		sig := got.(syscall.Signal)
		fmt.Fprintf(stderr, "mpsemu-client: stopped by %v\n", sig)
		return 128 + int(sig)
	case errors.As(err, &cerr):
		fmt.Fprintf(stderr, "mpsemu-client: %v\n", cerr)
		return ExitCode(cerr.Code)
	default:
		fmt.Fprintf(stderr, "mpsemu-client: %v\n", err)
		return 1
	}
}
