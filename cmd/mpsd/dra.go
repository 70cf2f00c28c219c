package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// draFlags are mpsd's DRA driver flags (--kubelet-dra); it shares
// --kubelet-groups and --kubelet-kubeconfig with the device plugin.
//
// The driver itself (dra_on.go, package dra) is built only with the build
// tag dra (go build -tags dra ./cmd/mpsd, make build-dra): it links
// client-go's clientset and the Kubernetes API types, which add some
// 40 MiB to the resident memory of every mpsd, used or not. Without it
// (dra_off.go) the flags are the same and --kubelet-dra says how to get
// a build that has it.
type draFlags struct {
	enabled  bool
	node     string
	capacity string
	cdiDir   string
	root     string
}

// The values of --kubelet-dra-capacity.
const (
	capacityAuto       = "auto"
	capacityConsumable = "consumable"
	capacityWhole      = "whole"
)

// DRA's defaults: the kubelet's root directory (plugins/mpsd.io holds the
// driver's socket, plugins_registry the kubelet's registration sockets)
// and the CDI spec directory (dra.DefaultCDIDir).
const (
	defaultKubeletRoot = "/var/lib/kubelet"
	defaultCDIDir      = "/var/run/cdi"
)

// isDRAFlag: the flags that need --kubelet-dra.
func isDRAFlag(name string) bool { return strings.HasPrefix(name, "kubelet-dra-") }

// isSharedKubeletFlag: the flags either --kubelet-device-plugin or
// --kubelet-dra reads.
func isSharedKubeletFlag(name string) bool {
	return name == "kubelet-groups" || name == "kubelet-kubeconfig"
}

// serverVersion is the API server's version as discovery reports it:
// major, minor ("36+" on some providers) and the full version.
type serverVersion func() (major, minor, full string, err error)

// draMode is --kubelet-dra-capacity's mode, capacityConsumable or
// capacityWhole: auto asks the API server's version, consumable capacity
// being on by default from Kubernetes 1.36; a version it cannot read
// gets consumable capacity (the driver logs it if the API server drops
// the slice's consumable fields).
func draMode(capacity string, version serverVersion, log *slog.Logger) (string, error) {
	switch capacity {
	case capacityConsumable:
		return capacityConsumable, nil
	case capacityWhole:
		log.Warn("--kubelet-dra-capacity=whole: each device is one claim's, with a lease of its group's max_sm and max_mem; claims cannot ask for sm or memory")
		return capacityWhole, nil
	case capacityAuto:
	default:
		return "", fmt.Errorf("--kubelet-dra-capacity %q: want auto, consumable or whole", capacity)
	}
	maj, mnr, full, err := version()
	if err != nil {
		log.Warn("cannot read the API server's version; publishing consumable capacity (--kubelet-dra-capacity=whole for a cluster without it)", "err", err)
		return capacityConsumable, nil
	}
	major, err1 := strconv.Atoi(strings.TrimRight(maj, "+"))
	minor, err2 := strconv.Atoi(strings.TrimRight(mnr, "+"))
	if err := errors.Join(err1, err2); err != nil {
		log.Warn("cannot read the API server's version; publishing consumable capacity (--kubelet-dra-capacity=whole for a cluster without it)", "major", maj, "minor", mnr, "err", err)
		return capacityConsumable, nil
	}
	if major > 1 || major == 1 && minor >= 36 {
		log.Info("the API server has consumable capacity: claims ask for sm and memory of a shared device", "server", full)
		return capacityConsumable, nil
	}
	log.Warn("the API server is older than Kubernetes 1.36, without consumable capacity: falling back to whole devices, each one claim's with a lease of its group's max_sm and max_mem", "server", full)
	return capacityWhole, nil
}
