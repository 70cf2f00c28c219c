//go:build dra

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/dra"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/mpsd"
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
	limits, err := dra.LoadLimits(configPath, groups, log)
	if err != nil {
		return nil, err
	}
	drv, err := dra.New(dra.Options{
		MPSD: deviceplugin.NewClient(d.SocketPath()), NodeName: node, Kube: kube, CDIDir: df.cdiDir,
		Groups: groups, Limits: limits, Mode: mode, Logger: log,
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
