package dra

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The kubelet's view: the driver served by the kubeletplugin helper on a
// socket in a temporary directory, over a fake API server holding the
// node and two users' claims. It publishes the node's ResourceSlice, and
// NodePrepareResources and NodeUnprepareResources over dra/v1 give each
// claim its lease and CDI device and release it.
func TestGRPCPrepareUnprepare(t *testing.T) {
	dir, err := os.MkdirTemp("", "dra") // short: a unix socket path is at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, sub := range []string{"plugin", "registry"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	f := newFakeMPSD(instance("inference", 0))
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-a-uid"}}
	kube := fake.NewClientset(node, alice, bob)
	d := newTestDriver(t, f, func(o *Options) { o.Kube = kube })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := kube.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	helper, err := kubeletplugin.Start(ctx, d, kubeletplugin.KubeClient(kube), kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName("node-a"), kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "plugin")),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(dir, "registry")))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- d.Run(ctx, helper) }()
	defer func() {
		cancel()
		helper.Stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	slice := nextSlice(t, w.ResultChan())
	if slice.Spec.Driver != DriverName || slice.Spec.Pool.Name != "node-a" || slice.Spec.NodeName == nil || *slice.Spec.NodeName != "node-a" ||
		len(slice.Spec.Devices) != 1 || slice.Spec.Devices[0].Name != "inference-gpu0" {
		t.Fatalf("published slice %+v, want node-a's pool with inference-gpu0", slice.Spec)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "plugin", "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := drapb.NewDRAPluginClient(conn)
	ref := func(c *resourceapi.ResourceClaim) *drapb.Claim {
		return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	}
	resp, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref(alice), ref(bob)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{alice, bob} {
		r := resp.Claims[string(c.UID)]
		if r == nil || r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "inference-gpu0" ||
			!slices.Equal(r.Devices[0].CdiDeviceIds, []string{CDIDeviceID(c.UID, 0)}) {
			t.Fatalf("claim %s/%s: %+v, want inference-gpu0 as %s", c.Namespace, c.Name, r, CDIDeviceID(c.UID, 0))
		}
	}
	if n := len(f.leases()); n != 2 {
		t.Fatalf("%d leases, want 2", n)
	}
	uresp, err := client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref(alice)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := uresp.Claims[string(alice.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if ls := f.leases(); len(ls) != 1 || ls[0].JobID != JobID(bob.UID, 0) {
		t.Fatalf("leases %+v, want bob's only", ls)
	}
}

// nextSlice waits for a ResourceSlice to be added.
func nextSlice(t *testing.T, events <-chan watch.Event) *resourceapi.ResourceSlice {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if s, ok := ev.Object.(*resourceapi.ResourceSlice); ok && ev.Type == watch.Added {
				return s
			}
		case <-t.Context().Done():
			t.Fatal("test ended")
		case <-afterWait():
			t.Fatal("no ResourceSlice published")
		}
	}
}
