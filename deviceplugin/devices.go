package deviceplugin

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// controlNodes are the NVIDIA device nodes every CUDA process needs besides
// its GPUs' own.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

// deviceNodes lists the device nodes of the GPUs named by uuids, for
// ContainerAllocateResponse.Devices: /dev/nvidia<minor> of each (the minor
// from the driver's /proc/driver/nvidia/gpus/*/information) and the
// control nodes, each only if it exists under devRoot. Without an NVIDIA
// driver (simulated GPUs) it returns nothing, and an error only when the
// driver's files exist but do not name every GPU.
func deviceNodes(procRoot, devRoot string, uuids []string) ([]*pluginapi.DeviceSpec, error) {
	infos, _ := filepath.Glob(filepath.Join(procRoot, "driver", "nvidia", "gpus", "*", "information"))
	if len(infos) == 0 {
		return nil, nil
	}
	minors := map[string]int{}
	for _, f := range infos {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("deviceplugin: GPU device nodes: %w", err)
		}
		if uuid, minor, ok := parseGPUInformation(b); ok {
			minors[strings.ToUpper(uuid)] = minor
		}
	}
	var specs []*pluginapi.DeviceSpec
	add := func(name string) {
		p := filepath.Join(devRoot, name)
		if _, err := os.Stat(p); err == nil {
			host := "/dev/" + name
			specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: host, HostPath: host, Permissions: "rw"})
		}
	}
	for _, u := range uuids {
		minor, ok := minors[strings.ToUpper(u)]
		if !ok {
			return nil, fmt.Errorf("deviceplugin: GPU %s not found in %s", u, filepath.Join(procRoot, "driver", "nvidia", "gpus"))
		}
		add("nvidia" + strconv.Itoa(minor))
	}
	for _, n := range controlNodes {
		add(n)
	}
	return specs, nil
}

// parseGPUInformation reads the UUID and device minor number of one GPU
// from the NVIDIA driver's information file ("GPU UUID:", "Device Minor:"
// lines).
func parseGPUInformation(b []byte) (uuid string, minor int, ok bool) {
	minor = -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "GPU UUID":
			uuid = v
		case "Device Minor":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 255 {
				return "", 0, false
			}
			minor = n
		}
	}
	if !strings.HasPrefix(uuid, "GPU-") || strings.ContainsAny(uuid, " \t/") || minor < 0 {
		return "", 0, false
	}
	return uuid, minor, true
}
