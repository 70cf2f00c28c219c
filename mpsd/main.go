package mpsd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/mpsd/mpsd/deviceplugin"
)

// DefaultConfigPath is where mpsd reads its config without --config.
const DefaultConfigPath = "/etc/mpsd/mpsd.yaml"

// Main is the mpsd command: flags, logger, New, Run. It returns the exit
// status: 0 after a clean stop (ctx done), 2 for bad usage, 1 otherwise.
//
// Under systemd (examples/systemd/) it takes the API socket passed in by
// mpsd.socket (LISTEN_FDS) and, with NOTIFY_SOCKET, reports READY=1 once
// every instance is up, keeps STATUS= current, sends STOPPING=1 when ctx
// ends and pings the watchdog (WatchdogSec=) while the daemon is healthy.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	return runMain(ctx, args, stderr, mainConfig{})
}

// mainConfig holds what tests change in Main.
type mainConfig struct {
	// statusEvery is how often STATUS= is refreshed; 0 means
	// defaultStatusInterval.
	statusEvery time.Duration
}

func runMain(ctx context.Context, args []string, stderr io.Writer, mc mainConfig) int {
	fs := flag.NewFlagSet("mpsd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", DefaultConfigPath, "config file (YAML, version 1)")
	simulate := fs.Bool("simulate", false, "run on simulated GPUs with the MPS emulator (the config's simulate section)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "text", "log format: text or json")
	var kf kubeletFlags
	fs.BoolVar(&kf.enabled, "kubelet-device-plugin", false, "also serve the kubelet as a device plugin: one resource mpsd.io/<group>-sm per group")
	fs.StringVar(&kf.dir, "kubelet-dir", deviceplugin.DefaultKubeletDir, "the kubelet's device-plugin directory (kubelet.sock), with --kubelet-device-plugin")
	fs.StringVar(&kf.groups, "kubelet-groups", "", "comma-separated groups to offer the kubelet; default every group, with --kubelet-device-plugin")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "usage: mpsd [--config FILE] [--simulate] [--log-level LEVEL] [--log-format text|json] [--kubelet-device-plugin [--kubelet-dir DIR] [--kubelet-groups G,...]]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "mpsd: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		_, _ = fmt.Fprintf(stderr, "mpsd: --log-level %q: want debug, info, warn or error\n", *level)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch *format {
	case "text":
		h = slog.NewTextHandler(stderr, hopts)
	case "json":
		h = slog.NewJSONHandler(stderr, hopts)
	default:
		_, _ = fmt.Fprintf(stderr, "mpsd: --log-format %q: want text or json\n", *format)
		return 2
	}
	kgroups, err := deviceplugin.ParseGroups(kf.groups)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "mpsd: --kubelet-groups: %v\n", err)
		return 2
	}
	log := slog.New(h)
	sd := newSdNotifier(log, mc.statusEvery)
	cannotStart := func(err error) int {
		sd.notify(statusLine("mpsd cannot start: " + err.Error()))
		log.Error("mpsd cannot start", "err", err)
		return 1
	}
	ln, err := activationListener(log)
	if err != nil {
		return cannotStart(err)
	}
	ready := make(chan struct{})
	var readyOnce sync.Once
	d, err := New(Options{
		ConfigPath: *configPath,
		Simulate:   *simulate,
		Logger:     log,
		Listener:   ln,
		PrivateShm: kf.privateShm(kgroups),
		Ready:      func() { readyOnce.Do(func() { close(ready) }) },
	})
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return cannotStart(err)
	}
	warnSocketElsewhere(log, ln, d)
	run := d.Run
	if kf.enabled {
		p, err := newDevicePlugin(d, kf, kgroups, log)
		if err != nil {
			_ = d.host.Close()
			if ln != nil {
				_ = ln.Close()
			}
			return cannotStart(err)
		}
		run = func(ctx context.Context) error { return runWithDevicePlugin(ctx, d, p, log) }
	}
	if err := sd.run(ctx, d, ready, run); err != nil {
		log.Error("mpsd failed", "err", err)
		return 1
	}
	return 0
}
