package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 20 * time.Second

// fakeKubelet is the kubelet's side of the device-plugin API, as the real
// kubelet speaks it: a Registration service on kubelet.sock; on Register
// it validates the request, dials the plugin's endpoint in the same
// directory, asks for its options and follows its ListAndWatch stream.
type fakeKubelet struct {
	t   *testing.T
	dir string

	mu      sync.Mutex
	srv     *grpc.Server
	served  chan struct{}
	plugins map[string]*pluginConn // by resource name
	// registered receives each registration as the kubelet accepted it.
	registered chan *pluginConn
}

// pluginConn is the kubelet's connection to one registered plugin.
type pluginConn struct {
	req    *pluginapi.RegisterRequest
	opts   *pluginapi.DevicePluginOptions
	client pluginapi.DevicePluginClient
	conn   *grpc.ClientConn
	// lists receives every device list ListAndWatch sends.
	lists  chan []*pluginapi.Device
	cancel context.CancelFunc
	done   chan struct{}
}

// extended resource names as the kubelet accepts them: a domain, then a
// qualified name.
var resourceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func newFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{t: t, dir: dir, plugins: map[string]*pluginConn{}, registered: make(chan *pluginConn, 64)}
	k.start()
	t.Cleanup(k.stop)
	return k
}

func (k *fakeKubelet) start() {
	k.t.Helper()
	ln, err := net.Listen("unix", filepath.Join(k.dir, KubeletSocket))
	if err != nil {
		k.t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterRegistrationServer(srv, registration{k: k})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	k.mu.Lock()
	k.srv, k.served = srv, served
	k.mu.Unlock()
}

// stop ends the registration service and every plugin connection.
func (k *fakeKubelet) stop() {
	k.mu.Lock()
	srv, served := k.srv, k.served
	k.srv = nil
	plugins := k.plugins
	k.plugins = map[string]*pluginConn{}
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
		<-served
	}
	for _, pc := range plugins {
		pc.close()
	}
}

// restart does what a kubelet does when it starts again: its old
// connections go, it deletes every socket in the directory, and serves a
// new kubelet.sock.
func (k *fakeKubelet) restart() {
	k.t.Helper()
	k.stop()
	ents, err := os.ReadDir(k.dir)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "kubelet_internal_checkpoint" {
			if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				k.t.Fatal(err)
			}
		}
	}
	k.start()
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *fakeKubelet
}

func (r registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	switch {
	case req.Version != pluginapi.Version:
		return nil, fmt.Errorf("unsupported version %q", req.Version)
	case !resourceRE.MatchString(req.ResourceName) || strings.HasPrefix(req.ResourceName, "kubernetes.io/"):
		return nil, fmt.Errorf("invalid extended resource name %q", req.ResourceName)
	case req.Endpoint == "" || strings.Contains(req.Endpoint, "/"):
		return nil, fmt.Errorf("endpoint %q is not a socket name in %s", req.Endpoint, k.dir)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{})
	cancel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("GetDevicePluginOptions of %s: %w", req.Endpoint, err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	stream, err := client.ListAndWatch(lctx, &pluginapi.Empty{})
	if err != nil {
		lcancel()
		_ = conn.Close()
		return nil, fmt.Errorf("ListAndWatch of %s: %w", req.Endpoint, err)
	}
	pc := &pluginConn{req: req, opts: opts, client: client, conn: conn, lists: make(chan []*pluginapi.Device, 256), cancel: lcancel, done: make(chan struct{})}
	go func() {
		defer close(pc.done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case pc.lists <- resp.Devices:
			default: // the test reads the lists it waits for
			}
		}
	}()
	k.mu.Lock()
	old := k.plugins[req.ResourceName]
	k.plugins[req.ResourceName] = pc
	k.mu.Unlock()
	if old != nil {
		old.close()
	}
	k.registered <- pc
	return &pluginapi.Empty{}, nil
}

func (pc *pluginConn) close() {
	pc.cancel()
	<-pc.done
	_ = pc.conn.Close()
}

// waitRegistered returns the registrations of the given resources, in any
// order, failing on any other.
func (k *fakeKubelet) waitRegistered(resources ...string) map[string]*pluginConn {
	k.t.Helper()
	got := map[string]*pluginConn{}
	deadline := time.After(waitFor)
	for len(got) < len(resources) {
		select {
		case pc := <-k.registered:
			name := pc.req.ResourceName
			if !slices.Contains(resources, name) {
				k.t.Fatalf("registration of %s, want only %v", name, resources)
			}
			got[name] = pc
		case <-deadline:
			k.t.Fatalf("registered %d of %v within %s", len(got), resources, waitFor)
		}
	}
	return got
}

// waitList returns the first device list from the plugin that satisfies
// cond, failing the test with the last one at the deadline.
func (pc *pluginConn) waitList(t *testing.T, what string, cond func([]*pluginapi.Device) bool) []*pluginapi.Device {
	t.Helper()
	deadline := time.After(waitFor)
	var last []*pluginapi.Device
	for {
		select {
		case devs := <-pc.lists:
			if cond(devs) {
				return devs
			}
			last = devs
		case <-deadline:
			t.Fatalf("%s: waiting for a device list of %s: last had %s", pc.req.ResourceName, what, summary(last))
		}
	}
}

// health counts the units per GPU and health: "gpu0 Healthy" → n.
func health(devs []*pluginapi.Device) map[string]int {
	out := map[string]int{}
	for _, d := range devs {
		u, err := ParseUnit(d.ID)
		if err != nil {
			out["bad "+d.ID]++
			continue
		}
		out[fmt.Sprintf("gpu%d %s", u.GPU, d.Health)]++
	}
	return out
}

func summary(devs []*pluginapi.Device) string {
	return fmt.Sprint(health(devs))
}
