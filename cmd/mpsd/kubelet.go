package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/mpsd"
)

// kubeletFlags are mpsd's device-plugin flags.
type kubeletFlags struct {
	enabled bool
	dir     string
	groups  string
}

// privateShm is mpsd.Options.PrivateShm: with the device plugin on, the groups
// it serves (every group without --kubelet-groups) run their daemons with
// a private /dev/shm, which Allocate mounts into their pods.
func (kf kubeletFlags) privateShm(groups []string) func(string) bool {
	if !kf.enabled {
		return nil
	}
	return func(group string) bool { return len(groups) == 0 || slices.Contains(groups, group) }
}

// newDevicePlugin builds the kubelet device plugin of --kubelet-device-plugin,
// a client of d's own API socket; groups come from deviceplugin.ParseGroups.
func newDevicePlugin(d *mpsd.Daemon, kf kubeletFlags, groups []string, log *slog.Logger) (*deviceplugin.Plugin, error) {
	return deviceplugin.New(deviceplugin.Options{
		MPSD:       deviceplugin.NewClient(d.SocketPath()),
		KubeletDir: kf.dir,
		Groups:     groups,
		Logger:     log.With("component", "deviceplugin"),
	})
}

// runWithDevicePlugin runs the daemon and the device plugin side by side.
// The plugin stops only after the daemon has: mpsd's own stop keeps the
// plugin's leases (closing their streams first would release them), so
// the next mpsd's plugin resumes them. A plugin that cannot start stops
// the daemon.
func runWithDevicePlugin(ctx context.Context, d *mpsd.Daemon, p *deviceplugin.Plugin, log *slog.Logger) error {
	dctx, stopDaemon := context.WithCancel(ctx)
	defer stopDaemon()
	pctx, stopPlugin := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPlugin()
	pluginErr := make(chan error, 1)
	go func() {
		err := p.Run(pctx)
		if err != nil {
			log.Error("kubelet device plugin failed; stopping mpsd", "err", err)
			stopDaemon()
		}
		pluginErr <- err
	}()
	err := d.Run(dctx)
	stopPlugin()
	if perr := <-pluginErr; perr != nil {
		err = errors.Join(err, fmt.Errorf("kubelet device plugin: %w", perr))
	}
	return err
}
