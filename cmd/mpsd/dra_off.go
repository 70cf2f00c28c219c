//go:build !dra

package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/mpsd/mpsd/mpsd"
)

// errNoDRA: this mpsd was built without the DRA driver.
var errNoDRA = errors.New("this mpsd was built without the DRA driver, which adds some 40 MiB to every mpsd's resident memory: use a build with it (go build -tags dra ./cmd/mpsd, or make build-dra), or the device plugin (--kubelet-device-plugin)")

// draRunner is the DRA driver, absent from this build.
type draRunner struct{}

func newDRA(*mpsd.Daemon, kubeletFlags, string, []string, *slog.Logger) (*draRunner, error) {
	return nil, errNoDRA
}

func runWithDRA(context.Context, *mpsd.Daemon, *draRunner) error { return errNoDRA }
