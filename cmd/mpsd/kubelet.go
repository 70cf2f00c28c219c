package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/mpsd"
	"github.com/mpsd/mpsd/policy"
)

// kubeletFlags are mpsd's device-plugin flags.
type kubeletFlags struct {
	enabled bool
	dir     string
	groups  string
	// The check that keeps pods' host root off the shared daemons
	// (kubeinfo.RootCheck): the kubeconfig that reads pods' specs, the
	// kubelet's PodResources socket, and its opt-out.
	kubeconfig    string
	podResources  string
	allowHostRoot bool
	// runtime is the container runtime's CRI socket, through which each
	// lease is bound to its pod's container (kubeinfo.Pods).
	runtime string
	// dra is the DRA driver's (--kubelet-dra), which shares groups and
	// kubeconfig.
	dra draFlags
}

// isKubeletFlag: the flags that need --kubelet-device-plugin.
func isKubeletFlag(name string) bool {
	return strings.HasPrefix(name, "kubelet-") && name != "kubelet-device-plugin" && name != "kubelet-dra" &&
		!isDRAFlag(name) && !isSharedKubeletFlag(name)
}

// check refuses the kubelet flags given without the server that reads
// them (--kubelet-device-plugin, --kubelet-dra, or either for
// --kubelet-groups and --kubelet-kubeconfig): they would be ignored, and
// an operator who wrote them expects it. The device plugin and the DRA
// driver are one or the other.
func (kf kubeletFlags) check(fs *flag.FlagSet) error {
	if kf.enabled && kf.dra.enabled {
		return errors.New("--kubelet-device-plugin and --kubelet-dra: give one (a node's pods use mpsd's devices through one or the other)")
	}
	var stray []string
	need := "--kubelet-device-plugin"
	fs.Visit(func(f *flag.Flag) {
		switch {
		case isSharedKubeletFlag(f.Name) && !kf.enabled && !kf.dra.enabled:
			stray = append(stray, "--"+f.Name)
			need = "--kubelet-device-plugin (or --kubelet-dra)"
		case isKubeletFlag(f.Name) && !kf.enabled:
			stray = append(stray, "--"+f.Name)
		case isDRAFlag(f.Name) && !kf.dra.enabled:
			stray = append(stray, "--"+f.Name)
			need = "--kubelet-dra"
		}
	})
	if len(stray) > 0 {
		return fmt.Errorf("%s given without %s: add it to serve the kubelet, or drop %s", strings.Join(stray, " and "), need, strings.Join(stray, " and "))
	}
	return nil
}

// warn logs, once at start, what would make the plugin fail its pods
// without an error of its own: a --kubelet-dir that does not exist (the
// plugin waits for a kubelet.sock there forever) and a group offered to
// the kubelet that is not multiuser (pods run as any uid, and a
// single-uid group serves one uid at a time per instance, so other pods
// wait). The daemon has already accepted the config; reading it again
// here only informs these warnings.
func (kf kubeletFlags) warn(log *slog.Logger, configPath string, groups []string) {
	if fi, err := os.Stat(kf.dir); err != nil {
		log.Warn("the kubelet's device-plugin directory is not there yet; the plugin waits for kubelet.sock in it: check --kubelet-dir if the kubelet runs", "kubelet_dir", kf.dir, "err", err)
	} else if !fi.IsDir() {
		log.Warn("--kubelet-dir is not a directory; the plugin waits for kubelet.sock in it", "kubelet_dir", kf.dir)
	}
	cfg, err := policy.LoadFile(configPath, policy.Host{})
	if err != nil {
		return
	}
	for _, g := range cfg.Groups {
		if len(groups) > 0 && !slices.Contains(groups, g.Name) {
			continue
		}
		if !g.Multiuser {
			log.Warn("group offered to the kubelet is not multiuser: pods run as any uid, and this group serves one uid at a time per instance, so pods of other users wait; set multiuser: true, or leave the group out with --kubelet-groups", "group", g.Name)
		}
	}
}

// privateShm is mpsd.Options.PrivateShm: with the device plugin or the
// DRA driver on, the groups it serves (every group without
// --kubelet-groups) run their daemons with a private /dev/shm, which
// Allocate (or a claim's CDI spec) mounts into their pods.
func (kf kubeletFlags) privateShm(groups []string) func(string) bool {
	if !kf.enabled && !kf.dra.enabled {
		return nil
	}
	return func(group string) bool { return len(groups) == 0 || slices.Contains(groups, group) }
}

// newDevicePlugin builds the kubelet device plugin of --kubelet-device-plugin,
// a client of d's own API socket; groups come from deviceplugin.ParseGroups.
func newDevicePlugin(d *mpsd.Daemon, kf kubeletFlags, groups []string, log *slog.Logger) (*deviceplugin.Plugin, error) {
	opts := deviceplugin.Options{
		MPSD:       deviceplugin.NewClient(d.SocketPath()),
		KubeletDir: kf.dir,
		Groups:     groups,
		Logger:     log.With("component", "deviceplugin"),
	}
	opts.Pods = kubeinfo.Pods{PodResources: kf.podResources, Runtime: kubeinfo.Runtime{Socket: kf.runtime}}
	log.Info("each lease is bound to the container holding its units: mpsd holds the container's processes to the lease's memory", "pod_resources", kf.podResources, "runtime", kf.runtime)
	if kf.allowHostRoot {
		log.Warn("--kubelet-allow-host-root: containers are started without checking whether they run as host root, which may quit or reconfigure the shared MPS daemons; only for nodes whose pods are all trusted")
	} else {
		opts.PodCheck = kubeinfo.RootCheck{PodResources: kf.podResources, Pods: &kubeinfo.LazyAPIServer{Kubeconfig: kf.kubeconfig}}
		log.Info("containers holding mpsd's units are checked before they start: none may run as host root", "kubeconfig", kf.kubeconfig, "pod_resources", kf.podResources)
	}
	return deviceplugin.New(opts)
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
