//go:build dra

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/dra"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/mpsd"
	"github.com/mpsd/mpsd/policy"
)

// nodeName is --kubelet-dra-node, else $NODE_NAME (the downward API's
// spec.nodeName in mpsd's pod), else the host name.
func (df draFlags) nodeName() (string, error) {
	if df.node != "" {
		return df.node, nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return strings.ToLower(h), nil
}

// kubeClient is the API client of --kubelet-kubeconfig (a file, or
// in-cluster for mpsd's pod's service account).
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == kubeinfo.InCluster {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "mpsd-dra"
	return kubernetes.NewForConfig(cfg)
}

// groupLimits are the config's groups' lease limits, for the devices'
// requestPolicy, read once at start (a reload that changes them is
// published at mpsd's next start); groups not offered are left out.
func groupLimits(configPath string, groups []string, log *slog.Logger) map[string]dra.Limits {
	cfg, err := policy.LoadFile(configPath, policy.Host{})
	if err != nil {
		return nil
	}
	out := map[string]dra.Limits{}
	for _, g := range cfg.Groups {
		if len(groups) > 0 && !slices.Contains(groups, g.Name) {
			continue
		}
		out[g.Name] = dra.Limits{MaxSM: g.MaxSM, DefaultSM: g.DefaultSM, MaxMem: g.MaxMem, DefaultMem: g.DefaultMem}
		if !g.Multiuser {
			log.Warn("group offered to DRA is not multiuser: pods run as any uid, and this group serves one uid at a time per instance, so pods of other users wait; set multiuser: true, or leave the group out with --kubelet-groups", "group", g.Name)
		}
	}
	return out
}

// draRunner is the DRA driver of --kubelet-dra and what starts its
// kubelet plugin.
type draRunner struct {
	driver *dra.Driver
	opts   []kubeletplugin.Option
	log    *slog.Logger
}

// newDRA builds the DRA driver of --kubelet-dra, a client of d's own API
// socket and of the API server.
func newDRA(d *mpsd.Daemon, kf kubeletFlags, configPath string, groups []string, log *slog.Logger) (*draRunner, error) {
	df := kf.dra
	log = log.With("component", "dra")
	node, err := df.nodeName()
	if err != nil {
		return nil, err
	}
	kube, err := kubeClient(kf.kubeconfig)
	if err != nil {
		return nil, err
	}
	m, err := draMode(df.capacity, func() (string, string, string, error) {
		v, err := kube.Discovery().ServerVersion()
		if err != nil {
			return "", "", "", err
		}
		return v.Major, v.Minor, v.GitVersion, nil
	}, log)
	if err != nil {
		return nil, err
	}
	mode := dra.Consumable
	if m == capacityWhole {
		mode = dra.Whole
	}
	pluginDir, registryDir := filepath.Join(df.root, "plugins", dra.DriverName), filepath.Join(df.root, "plugins_registry")
	for _, dir := range []string{pluginDir, registryDir} {
		// The kubelet makes plugins_registry too, when it starts.
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("kubelet plugin directory: %w", err)
		}
	}
	drv, err := dra.New(dra.Options{
		MPSD: deviceplugin.NewClient(d.SocketPath()), NodeName: node, Kube: kube, CDIDir: df.cdiDir,
		Groups: groups, Limits: groupLimits(configPath, groups, log), Mode: mode, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("serving the kubelet as DRA driver "+dra.DriverName, "node", node, "mode", mode.String(), "cdi_dir", df.cdiDir, "plugin_dir", pluginDir)
	return &draRunner{driver: drv, log: log, opts: []kubeletplugin.Option{
		kubeletplugin.KubeClient(kube), kubeletplugin.DriverName(dra.DriverName), kubeletplugin.NodeName(node),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
	}}, nil
}

// runWithDRA runs the daemon and the DRA driver side by side, as
// runWithDevicePlugin runs the device plugin: the driver stops only
// after the daemon has, so mpsd keeps the claims' leases for the next
// mpsd's driver, and a driver that cannot start stops the daemon.
func runWithDRA(ctx context.Context, d *mpsd.Daemon, r *draRunner) error {
	dctx, stopDaemon := context.WithCancel(ctx)
	defer stopDaemon()
	pctx, stopDriver := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDriver()
	driverErr := make(chan error, 1)
	go func() {
		err := r.run(pctx)
		if err != nil {
			r.log.Error("DRA driver failed; stopping mpsd", "err", err)
			stopDaemon()
		}
		driverErr <- err
	}()
	err := d.Run(dctx)
	stopDriver()
	if derr := <-driverErr; derr != nil {
		err = errors.Join(err, fmt.Errorf("DRA driver: %w", derr))
	}
	return err
}

// run starts the kubelet plugin and runs the driver until ctx ends.
func (r *draRunner) run(ctx context.Context) error {
	helper, err := kubeletplugin.Start(ctx, r.driver, r.opts...)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	return r.driver.Run(ctx, helper)
}
