package dra

import (
	"context"
	"encoding/json"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// LeaseData is the data of a prepared device in its claim's status
// (status.devices[].data): the lease that backs it.
type LeaseData struct {
	Lease    string   `json:"lease"`
	State    string   `json:"state"`
	Group    string   `json:"group"`
	SM       int      `json:"sm"`
	MemBytes int64    `json:"memBytes"`
	GPUs     []string `json:"gpus,omitempty"`
}

// writeStatus records c's leases in its claim's status.devices, one
// entry per device this driver prepared (others' entries are kept). It
// is best effort: a claim that cannot be read or written back is
// logged, and preparing it does not fail for it.
func (d *Driver) writeStatus(ctx context.Context, c *claim) {
	if d.opts.Kube == nil {
		return
	}
	rcs := d.opts.Kube.ResourceV1().ResourceClaims(c.namespace)
	rc, err := rcs.Get(ctx, c.name, metav1.GetOptions{})
	if err != nil || rc.UID != c.uid {
		d.log.Warn("cannot read the claim to record its leases", "namespace", c.namespace, "claim", c.name, "err", err)
		return
	}
	devs := slices.DeleteFunc(slices.Clone(rc.Status.Devices), func(s resourceapi.AllocatedDeviceStatus) bool { return s.Driver == DriverName })
	d.mu.Lock()
	for _, l := range c.leases {
		if l.granted == nil {
			continue
		}
		data, err := json.Marshal(LeaseData{Lease: l.granted.ID, State: "running", Group: l.group, SM: l.granted.SM,
			MemBytes: l.granted.MemBytes, GPUs: l.granted.GPUUUIDs})
		if err != nil {
			continue
		}
		s := resourceapi.AllocatedDeviceStatus{Driver: DriverName, Pool: l.pool, Device: l.device, Data: &runtime.RawExtension{Raw: data}}
		if l.shareID != nil {
			id := string(*l.shareID)
			s.ShareID = &id
		}
		devs = append(devs, s)
	}
	d.mu.Unlock()
	rc = rc.DeepCopy()
	rc.Status.Devices = devs
	if _, err := rcs.UpdateStatus(ctx, rc, metav1.UpdateOptions{}); err != nil {
		d.log.Warn("cannot record the claim's leases in its status", "namespace", c.namespace, "claim", c.name, "err", err)
	}
}
