package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// CDIKind is the CDI kind of the devices the driver prepares: one CDI
// device per lease, named after its claim and device (CDIDeviceID).
const CDIKind = DriverName + "/claim"

// CDIDeviceID is the CDI device of the lease of a claim's n-th device:
// the claim's UID in it, never reused, so a runtime's cache never hands
// out an older claim's device.
func CDIDeviceID(claim types.UID, n int) string {
	return CDIKind + "=" + cdiName(claim, n)
}

func cdiName(claim types.UID, n int) string { return string(claim) + "-" + strconv.Itoa(n) }

// validUID reports whether uid may name a CDI spec file and a job id:
// 1 to 64 letters, digits, '-', '_' or '.' (a Kubernetes UID is a
// UUID), so that no UID reaches outside CDIDir.
func validUID(uid types.UID) bool {
	if uid == "" || len(uid) > 64 || uid == "." || uid == ".." {
		return false
	}
	for _, r := range string(uid) {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// checkUID refuses a claim UID that is not validUID.
func checkUID(uid types.UID) error {
	if !validUID(uid) {
		return errf("claim UID %q is not a UID (1 to 64 letters, digits, '-', '_' or '.')", uid)
	}
	return nil
}

// checkCDIDir refuses a CDI directory that someone other than root (or
// euid) could change: a runtime reads its specs as root. One not there
// yet is made, 0755.
func checkCDIDir(dir string, euid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errf("CDI directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return errf("CDI directory: %w", err)
	}
	if fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
		return errf("CDI directory %s is not a directory (a symlink?); give the real directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != euid {
		return errf("CDI directory %s is owned by uid %d, not root; chown root %s", dir, st.Uid, dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return errf("CDI directory %s is writable by its group or by others (mode %s); chmod go-w %s", dir, fi.Mode().Perm(), dir)
	}
	return nil
}

// specPath is the CDI spec file of a claim.
func (d *Driver) specPath(claim types.UID) string {
	return filepath.Join(d.opts.CDIDir, DriverName+"-claim_"+string(claim)+".json")
}

// Spec is the CDI spec of the claim whose leases are edits by device
// index: each lease's container edits (deviceplugin.ContainerEdits) as a
// CDI device: its environment, its mounts as read-only or read-write
// bind mounts (the pipe directory, /dev/null over its FIFO, pid file and
// lock, the instance's private /dev/shm) and its device nodes.
func Spec(claim types.UID, edits map[int]*pluginapi.ContainerAllocateResponse) *cdispec.Spec {
	spec := &cdispec.Spec{Version: cdispec.CurrentVersion, Kind: CDIKind}
	ns := make([]int, 0, len(edits))
	for n := range edits {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	for _, n := range ns {
		e := edits[n]
		var ce cdispec.ContainerEdits
		keys := make([]string, 0, len(e.Envs))
		for k := range e.Envs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			ce.Env = append(ce.Env, k+"="+e.Envs[k])
		}
		for _, m := range e.Mounts {
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			ce.Mounts = append(ce.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind",
				Options: []string{"rbind", "rprivate", "nosuid", "nodev", mode}})
		}
		for _, dv := range e.Devices {
			ce.DeviceNodes = append(ce.DeviceNodes, &cdispec.DeviceNode{Path: dv.ContainerPath, HostPath: dv.HostPath, Permissions: dv.Permissions})
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: cdiName(claim, n), ContainerEdits: ce})
	}
	return spec
}

// writeSpec writes c's CDI spec, atomically (a temporary file renamed
// over it). A claim one of whose leases was adopted and not yet granted
// again keeps the spec an earlier process wrote, if there is one.
func (d *Driver) writeSpec(c *claim) error {
	d.mu.Lock()
	edits := map[int]*pluginapi.ContainerAllocateResponse{}
	complete := true
	for _, l := range c.leases {
		if l.edits == nil {
			complete = false
		}
		edits[l.n] = l.edits
	}
	d.mu.Unlock()
	path := d.specPath(c.uid)
	if !complete {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		return errf("claim %s: a lease adopted after a restart has not been resumed yet", c.uid)
	}
	b, err := json.MarshalIndent(Spec(c.uid, edits), "", "  ")
	if err != nil {
		return errf("CDI spec: %w", err)
	}
	if err := writeAtomic(path, append(b, '\n')); err != nil {
		return errf("write CDI spec: %w", err)
	}
	d.mu.Lock()
	c.specWritten = true
	d.mu.Unlock()
	return nil
}

// removeSpec removes a claim's CDI spec; one not there is no error.
func (d *Driver) removeSpec(claim types.UID) error {
	if err := os.Remove(d.specPath(claim)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errf("remove CDI spec: %w", err)
	}
	return nil
}

// writeAtomic writes data to path through a temporary file in its
// directory, synced and renamed over it: a runtime reading the directory
// sees the old spec or the new one, never part of one.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	ok = true
	return nil
}
