// Command mpsd is the daemon that shares a host's GPUs through CUDA MPS:
// `mpsd --config /etc/mpsd/mpsd.yaml`, or `mpsd --simulate` on any Linux
// machine. The daemon is package mpsd; this command is its only
// composition root: flags, logger, systemd (internal/sdnotify), the
// simulated host (simulate.go) and the kubelet device plugin beside the
// daemon (kubelet.go). Under systemd it runs as a Type=notify service
// with a socket-activated API socket (examples/systemd/); see docs/architecture.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/internal/buildinfo"
	"github.com/mpsd/mpsd/internal/cli"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/internal/sdnotify"
	"github.com/mpsd/mpsd/mpsd"
)

// defaultConfigPath is where mpsd reads its config without --config.
const defaultConfigPath = "/etc/mpsd/mpsd.yaml"

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
	os.Exit(run(ctx, os.Args[1:], os.Stderr, runConfig{}))
}

// runConfig holds what tests change in run.
type runConfig struct {
	// stdout is where --version prints; nil means os.Stdout.
	stdout io.Writer
	// statusEvery is how often STATUS= is refreshed; 0 means sdnotify's
	// default.
	statusEvery time.Duration
}

// run is the mpsd command: flags, logger, the daemon's parts, New, Run.
// It returns the exit status: 0 after a clean stop (ctx done), 2 for bad
// usage, 1 otherwise.
//
// Under systemd (examples/systemd/) it takes the API socket passed in by
// mpsd.socket (LISTEN_FDS) and, with NOTIFY_SOCKET, reports READY=1 once
// every instance is up, keeps STATUS= current, sends STOPPING=1 when ctx
// ends and pings the watchdog (WatchdogSec=) while the daemon is healthy.
func run(ctx context.Context, args []string, stderr io.Writer, rc runConfig) int {
	fs := flag.NewFlagSet("mpsd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	f := defineFlags(fs)
	configPath, simulate, level, format, version, kf := f.config, f.simulate, f.level, f.format, f.version, f.kubelet
	out := rc.stdout
	if out == nil {
		out = os.Stdout
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprint(out, usage(fs))
			return 0
		}
		_, _ = fmt.Fprintf(stderr, "mpsd: %s\nRun 'mpsd --help' for the flags.\n", cli.FlagError(err, fs))
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "mpsd: unexpected argument %q\nRun 'mpsd --help' for the flags.\n", fs.Arg(0))
		return 2
	}
	if *version {
		_, _ = fmt.Fprintln(out, buildinfo.Read().Line("mpsd"))
		return 0
	}
	if err := kf.check(fs); err != nil {
		_, _ = fmt.Fprintf(stderr, "mpsd: %v\n", err)
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
	sd := sdnotify.New(log, rc.statusEvery)
	cannotStart := func(err error) int {
		// A config's problems one record each, then this one with
		// their number.
		msg, n := mpsd.LogConfigProblems(log, err)
		sd.Notify(sdnotify.StatusLine("mpsd cannot start: " + msg))
		if n > 0 {
			log.Error("mpsd cannot start", "err", msg, "problems", n)
		} else {
			log.Error("mpsd cannot start", "err", err)
		}
		return 1
	}
	ln, err := sdnotify.ActivationListener(log)
	if err != nil {
		return cannotStart(err)
	}
	closeListener := func() {
		if ln != nil {
			_ = ln.Close()
		}
	}
	ready := make(chan struct{})
	var readyOnce sync.Once
	opts := mpsd.Options{
		ConfigPath: *configPath,
		Logger:     log,
		Listener:   ln,
		PrivateShm: kf.privateShm(kgroups),
		Ready:      func() { readyOnce.Do(func() { close(ready) }) },
	}
	if *simulate {
		if err := simulation(&opts, log); err != nil {
			closeListener()
			return cannotStart(err)
		}
	}
	d, err := mpsd.New(opts)
	if err != nil {
		closeListener()
		return cannotStart(err)
	}
	warnSocketElsewhere(log, ln, d.ConfigSocket())
	runDaemon := d.Run
	if kf.enabled {
		kf.warn(log, *configPath, kgroups)
		p, err := newDevicePlugin(d, *kf, kgroups, log)
		if err != nil {
			_ = d.Close()
			closeListener()
			return cannotStart(err)
		}
		runDaemon = func(ctx context.Context) error { return runWithDevicePlugin(ctx, d, p, log) }
	}
	if kf.dra.enabled {
		r, err := newDRA(d, *kf, *configPath, kgroups, log)
		if err != nil {
			_ = d.Close()
			closeListener()
			return cannotStart(fmt.Errorf("--kubelet-dra: %w", err))
		}
		runDaemon = func(ctx context.Context) error { return runWithDRA(ctx, d, r) }
	}
	if err := sd.Run(ctx, d, ready, runDaemon); err != nil {
		if errors.Is(err, mpsd.ErrStateInUse) || errors.Is(err, mpsd.ErrSocketInUse) {
			// Another mpsd serves this state or socket: this one
			// stopped before it touched anything.
			return cannotStart(err)
		}
		log.Error("mpsd failed", "err", err)
		return 1
	}
	return 0
}

// mpsdFlags are mpsd's flags, as defineFlags defines them.
type mpsdFlags struct {
	config, level, format *string
	simulate, version     *bool
	kubelet               *kubeletFlags
}

// defineFlags defines mpsd's flags on fs: run parses them, and mpsd(8)
// and the completion scripts are generated from them (manual.go).
func defineFlags(fs *flag.FlagSet) mpsdFlags {
	f := mpsdFlags{kubelet: &kubeletFlags{}}
	f.config = fs.String("config", defaultConfigPath, "the config `FILE` (YAML, version 1; default "+defaultConfigPath+")")
	f.simulate = fs.Bool("simulate", false, "run on simulated GPUs with the MPS emulator (the config's simulate section)")
	f.level = fs.String("log-level", "info", "log `LEVEL`: debug, info (default), warn or error")
	f.format = fs.String("log-format", "text", "log `FORMAT`: text (default) or json")
	fs.BoolVar(&f.kubelet.enabled, "kubelet-device-plugin", false, "also serve the kubelet as a device plugin: one resource mpsd.io/<group>-sm per group")
	fs.StringVar(&f.kubelet.dir, "kubelet-dir", deviceplugin.DefaultKubeletDir, "the kubelet's device-plugin `DIR` (kubelet.sock; default "+deviceplugin.DefaultKubeletDir+"), with --kubelet-device-plugin")
	fs.StringVar(&f.kubelet.groups, "kubelet-groups", "", "comma-separated `GROUPS` to offer the kubelet; default every group, with --kubelet-device-plugin or --kubelet-dra")
	fs.StringVar(&f.kubelet.kubeconfig, "kubelet-kubeconfig", kubeinfo.DefaultKubeconfig, "kubeconfig `FILE` that reads the specs of pods on this node (default the kubelet's own, "+kubeinfo.DefaultKubeconfig+"), or "+kubeinfo.InCluster+" for mpsd's pod's service account, with --kubelet-device-plugin; with --kubelet-dra the client of the API server that reads claims, publishes the node's ResourceSlice and writes claims' status")
	fs.StringVar(&f.kubelet.podResources, "kubelet-pod-resources", kubeinfo.DefaultPodResourcesSocket, "the kubelet's PodResources API `SOCKET` (default "+kubeinfo.DefaultPodResourcesSocket+"), with --kubelet-device-plugin")
	fs.StringVar(&f.kubelet.runtime, "kubelet-cri", kubeinfo.DefaultRuntimeSocket, "the container runtime's CRI `SOCKET` (default containerd's, "+kubeinfo.DefaultRuntimeSocket+"; CRI-O's is /var/run/crio/crio.sock), through which each lease is bound to its pod's container, with --kubelet-device-plugin")
	fs.BoolVar(&f.kubelet.allowHostRoot, "kubelet-allow-host-root", false, "start containers holding mpsd's units without checking that they do not run as host root (trusted pods only), with --kubelet-device-plugin")
	fs.BoolVar(&f.kubelet.dra.enabled, "kubelet-dra", false, "also serve the kubelet as DRA driver mpsd.io: a ResourceSlice of one device per GPU and group, sm and memory as consumable capacity, each claim a lease (not with --kubelet-device-plugin; only in an mpsd built with the tag dra, make build-dra)")
	fs.StringVar(&f.kubelet.dra.node, "kubelet-dra-node", "", "this node's `NAME` in the cluster (default $NODE_NAME, else the host name), with --kubelet-dra")
	fs.StringVar(&f.kubelet.dra.capacity, "kubelet-dra-capacity", capacityAuto, "`MODE` of sharing a device: consumable (claims ask for sm and memory; Kubernetes 1.36 on), whole (one claim per device), or auto (default: by the API server's version), with --kubelet-dra")
	fs.StringVar(&f.kubelet.dra.cdiDir, "kubelet-dra-cdi-dir", defaultCDIDir, "`DIR` of the claims' CDI specs, where the container runtime reads them (default "+defaultCDIDir+"), with --kubelet-dra")
	fs.StringVar(&f.kubelet.dra.root, "kubelet-dra-root", defaultKubeletRoot, "the kubelet's root `DIR` (default "+defaultKubeletRoot+"): the driver's socket goes in plugins/mpsd.io, its registration in plugins_registry, with --kubelet-dra")
	f.version = fs.Bool("version", false, "print mpsd's version, commit and Go version, and exit")
	return f
}

// usageSynopsis holds the forms of mpsd's command line.
var usageSynopsis = []string{`mpsd [--config FILE] [--simulate] [--log-level LEVEL] [--log-format text|json]
            [--kubelet-device-plugin [--kubelet-dir DIR] [--kubelet-groups G,...]
             [--kubelet-kubeconfig FILE|in-cluster] [--kubelet-pod-resources SOCKET]
             [--kubelet-cri SOCKET] [--kubelet-allow-host-root]]
            [--kubelet-dra [--kubelet-dra-node NAME] [--kubelet-dra-capacity MODE]
             [--kubelet-dra-cdi-dir DIR] [--kubelet-dra-root DIR]
             [--kubelet-groups G,...] [--kubelet-kubeconfig FILE|in-cluster]]`, "mpsd --version"}

// usageAbout says what mpsd does.
const usageAbout = `Shares the host's GPUs among the config's tenant groups through CUDA MPS:
one MPS control daemon per GPU and group, leases asked for by mps-launch
and shown and managed by mpsctl, on the API socket the config names.
SIGTERM or SIGINT stops mpsd and leaves the MPS daemons and the workloads
running for the next mpsd to adopt; mpsctl shutdown stops them too.`

// usageExit says what run's exit statuses mean.
const usageExit = `0 after a clean stop; 1 mpsd cannot start (an invalid config,
another mpsd on its state or socket) or failed; 2 usage error.`

// usage is ` + "`mpsd --help`" + `, in the form of mpsctl's and mps-launch's: the
// synopsis, what mpsd does, its flags (from fs) and its exit statuses.
func usage(fs *flag.FlagSet) string {
	return "usage: " + strings.Join(usageSynopsis, "\n       ") + "\n\n" + usageAbout + "\n\n" +
		cli.FlagTable(fs) + "Exit status: " + usageExit + "\n"
}

// warnSocketElsewhere warns when the socket systemd passed is not the
// config's socket: mps-launch and mpsctl look for mpsd there (or at
// MPSD_SOCKET), so they would not reach it.
func warnSocketElsewhere(log *slog.Logger, ln net.Listener, want string) {
	if ln == nil {
		return
	}
	if got := ln.Addr().String(); got != want {
		log.Warn("the socket systemd passed is not the config's socket; mps-launch and mpsctl look for mpsd at the config's (or MPSD_SOCKET): make ListenStream= in mpsd.socket and socket: in the config the same", "systemd", got, "config", want)
	}
}
