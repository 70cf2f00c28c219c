package kubeinfo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func i64(v int64) *int64 { return &v }
func yes() *bool         { b := true; return &b }
func no() *bool          { b := false; return &b }

// noEsc is a container securityContext with allowPrivilegeEscalation:
// false, and uid when not nil.
func noEsc(uid *int64) *corev1.SecurityContext {
	return &corev1.SecurityContext{RunAsUser: uid, AllowPrivilegeEscalation: no()}
}

func podWith(hostUsers *bool, psc *corev1.PodSecurityContext, cscs ...*corev1.SecurityContext) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	p.Spec.HostUsers, p.Spec.SecurityContext = hostUsers, psc
	for i, sc := range cscs {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c" + string(rune('0'+i)), SecurityContext: sc})
	}
	return p
}

// The rule, case by case: what may run as host root is refused, whatever
// level sets it; a user namespace or a non-root uid (set, or enforced by
// runAsNonRoot) is allowed.
func TestHostRoot(t *testing.T) {
	init0 := podWith(nil, &corev1.PodSecurityContext{RunAsNonRoot: yes()}, noEsc(nil))
	init0.Spec.InitContainers = []corev1.Container{{Name: "setup", SecurityContext: &corev1.SecurityContext{RunAsUser: i64(0), RunAsNonRoot: no()}}}
	eph := podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, noEsc(nil))
	eph.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", SecurityContext: &corev1.SecurityContext{RunAsUser: i64(0)}}}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string // "" allowed, else part of the refusal
	}{
		{"nothing set: the image decides", podWith(nil, nil, nil), `container "c0" may run as uid 0`},
		{"runAsUser 0", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(0)}, nil), "runAsUser: 0"},
		{"hostUsers true, runAsUser 0", podWith(yes(), nil, &corev1.SecurityContext{RunAsUser: i64(0)}), "runAsUser: 0"},
		{"pod non-root", podWith(nil, &corev1.PodSecurityContext{RunAsNonRoot: yes()}, noEsc(nil)), ""},
		{"pod uid 1000", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, noEsc(nil)), ""},
		{"pod uid 1000, privilege escalation unset", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, nil), `container "c0" runs as a non-root uid but may gain root`},
		{"pod non-root, privilege escalation allowed", podWith(nil, &corev1.PodSecurityContext{RunAsNonRoot: yes()}, &corev1.SecurityContext{AllowPrivilegeEscalation: yes()}), "allowPrivilegeEscalation: false"},
		{"privileged, non-root", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, &corev1.SecurityContext{Privileged: yes()}), "may gain root"},
		{"pod uid 1000, a container uid 0", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, noEsc(nil), &corev1.SecurityContext{RunAsUser: i64(0), AllowPrivilegeEscalation: no()}), `container "c1" runs as uid 0`},
		{"pod non-root, a container not", podWith(nil, &corev1.PodSecurityContext{RunAsNonRoot: yes()}, &corev1.SecurityContext{RunAsNonRoot: no(), AllowPrivilegeEscalation: no()}), `container "c0" may run as uid 0`},
		{"container uid 1000", podWith(nil, nil, noEsc(i64(1000))), ""},
		{"uid 0 under runAsNonRoot (the kubelet refuses it)", podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(0), RunAsNonRoot: yes()}, noEsc(nil)), ""},
		{"user namespace", podWith(no(), nil, &corev1.SecurityContext{RunAsUser: i64(0)}), ""},
		{"root init container", init0, `init container "setup" runs as uid 0`},
		{"root ephemeral container", eph, `ephemeral container "debug" runs as uid 0`},
	} {
		err := HostRoot(fromAPI(t, tc.pod))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.want)
		}
	}
}

func TestAsksMPSD(t *testing.T) {
	p := podWith(nil, nil, nil, nil)
	if AsksMPSD(fromAPI(t, p)) {
		t.Error("a pod without resources asks for mpsd's")
	}
	p.Spec.Containers[1].Resources.Limits = corev1.ResourceList{"mpsd.io/inference-sm": {}}
	if !AsksMPSD(fromAPI(t, p)) {
		t.Error("a pod with an mpsd.io limit does not ask for mpsd's")
	}
}

// fromAPI is pod as the API server sends it, decoded as the check reads it.
func fromAPI(t *testing.T, pod *corev1.Pod) *Pod {
	t.Helper()
	b, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodePod(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fakePodResources serves the kubelet's PodResources List on a unix socket.
type fakePodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods []*podresourcesapi.PodResources
}

func (f *fakePodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return &podresourcesapi.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// servePodResources serves pods as the kubelet's PodResources API on a
// socket in dir, until the test ends; it returns the socket.
func servePodResources(t *testing.T, dir string, pods []*podresourcesapi.PodResources) string {
	t.Helper()
	sock := filepath.Join(dir, "pod-resources.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, &fakePodResources{pods: pods})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return sock
}

func podRes(ns, name, ctr, resource string, ids ...string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesapi.ContainerResources{
		{Name: "sidecar"},
		{Name: ctr, Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}},
	}}
}

func TestLocate(t *testing.T) {
	sock := servePodResources(t, t.TempDir(), []*podresourcesapi.PodResources{
		podRes("ns", "a", "gpu", "mpsd.io/x-sm", "x-gpu0-sm0", "x-gpu0-sm1"),
		podRes("ns", "b", "gpu", "mpsd.io/x-sm", "x-gpu0-sm2"),
		podRes("ns", "c", "gpu", "mpsd.io/y-sm", "x-gpu0-sm3"),
	})
	ctx := context.Background()
	ref, err := Locate(ctx, sock, "mpsd.io/x-sm", []string{"x-gpu0-sm1", "x-gpu0-sm0"})
	if err != nil || ref != (ContainerRef{"ns", "a", "gpu"}) {
		t.Errorf("Locate: %v %v", ref, err)
	}
	if _, err := Locate(ctx, sock, "mpsd.io/x-sm", []string{"x-gpu0-sm3"}); err == nil || !strings.Contains(err.Error(), "no container") {
		t.Errorf("Locate of another resource's id: %v", err)
	}
	if _, err := Locate(ctx, sock, "mpsd.io/x-sm", []string{"x-gpu0-sm1", "x-gpu0-sm2"}); err == nil {
		t.Error("Locate of ids split over two containers succeeded")
	}
	if _, err := Locate(ctx, filepath.Join(t.TempDir(), "none.sock"), "mpsd.io/x-sm", []string{"x-gpu0-sm0"}); err == nil || !strings.Contains(err.Error(), "PodResources API") {
		t.Errorf("Locate without a kubelet: %v", err)
	}
}

// selfSigned makes a CA-less certificate for name (server, or client).
func selfSigned(t *testing.T, name string, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// fakeAPIServer serves pods over TLS; auth checks each request.
func fakeAPIServer(t *testing.T, pods map[string]*corev1.Pod, auth func(*http.Request) bool) (*httptest.Server, []byte) {
	t.Helper()
	cert, key := selfSigned(t, "apiserver", false)
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"kind":"Status","message":"Unauthorized"}`))
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/")
		if len(parts) != 3 || parts[1] != "pods" || pods[parts[0]+"/"+parts[2]] == nil {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","message":"pods \"` + parts[len(parts)-1] + `\" not found"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(pods[parts[0]+"/"+parts[2]])
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, cert
}

func write(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A kubeconfig with a token file, one with a client certificate (the
// kubelet's, cert and key in one file), and in-cluster: each reads the
// pod; a wrong credential, an unknown pod and a server of another CA are
// errors.
func TestAPIServerPod(t *testing.T) {
	dir := t.TempDir()
	clientCert, clientKey := selfSigned(t, "system:node:n", true)
	pod := podWith(nil, &corev1.PodSecurityContext{RunAsUser: i64(1000)}, nil)
	srv, ca := fakeAPIServer(t, map[string]*corev1.Pod{"ns/p": pod}, func(r *http.Request) bool {
		if r.Header.Get("Authorization") == "Bearer good" {
			return true
		}
		return r.TLS != nil && len(r.TLS.PeerCertificates) == 1 && r.TLS.PeerCertificates[0].Subject.CommonName == "system:node:n"
	})
	write(t, filepath.Join(dir, "ca.crt"), ca)
	write(t, filepath.Join(dir, "token"), []byte("good\n"))
	write(t, filepath.Join(dir, "kubelet-client-current.pem"), append(clientCert, clientKey...))
	kc := func(name, user string) string {
		return write(t, filepath.Join(dir, name), []byte(`apiVersion: v1
kind: Config
current-context: c
clusters:
- name: k
  cluster:
    server: `+srv.URL+`
    certificate-authority: ca.crt
contexts:
- name: c
  context: {cluster: k, user: u}
users:
- name: u
  user:
`+user))
	}
	ctx := context.Background()
	for name, path := range map[string]string{
		"token file":         kc("token.conf", "    tokenFile: token\n"),
		"client certificate": kc("kubelet.conf", "    client-certificate: "+filepath.Join(dir, "kubelet-client-current.pem")+"\n    client-key: kubelet-client-current.pem\n"),
	} {
		a, err := NewAPIServer(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := a.Pod(ctx, "ns", "p")
		if err != nil || got.Spec.SecurityContext == nil || *got.Spec.SecurityContext.RunAsUser != 1000 {
			t.Errorf("%s: Pod: %v %v", name, got, err)
		}
		if _, err := a.Pod(ctx, "ns", "q"); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("%s: an unknown pod: %v", name, err)
		}
	}
	a, err := NewAPIServer(kc("bad.conf", "    token: bad\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pod(ctx, "ns", "p"); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("a bad token: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	a, err = inCluster(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pod(ctx, "ns", "p"); err != nil {
		t.Errorf("in-cluster: %v", err)
	}
	// A server whose certificate the CA did not sign.
	other, _ := fakeAPIServer(t, nil, func(*http.Request) bool { return true })
	write(t, filepath.Join(dir, "other.conf"), []byte(strings.ReplaceAll(string(mustRead(t, filepath.Join(dir, "token.conf"))), srv.URL, other.URL)))
	a, err = NewAPIServer(filepath.Join(dir, "other.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pod(ctx, "ns", "p"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server of another CA: %v", err)
	}
	if _, err := NewAPIServer(write(t, filepath.Join(dir, "insecure.conf"), []byte("current-context: c\nclusters:\n- name: k\n  cluster: {server: https://x, insecure-skip-tls-verify: true}\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"))); err == nil {
		t.Error("a kubeconfig skipping TLS verification was taken")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type pods map[string]*corev1.Pod

func (p pods) Pod(_ context.Context, ns, name string) (*Pod, error) {
	if pod := p[ns+"/"+name]; pod != nil {
		b, err := json.Marshal(pod)
		if err != nil {
			return nil, err
		}
		return DecodePod(b)
	}
	return nil, errors.New("not found")
}

// RootCheck: a root container is refused naming the pod, container and
// why; a non-root one and a user-namespaced one are allowed; no kubelet or
// no API server fails closed.
func TestRootCheck(t *testing.T) {
	const res = "mpsd.io/x-sm"
	sock := servePodResources(t, t.TempDir(), []*podresourcesapi.PodResources{
		podRes("ns", "root", "gpu", res, "x-gpu0-sm0"),
		podRes("ns", "user", "gpu", res, "x-gpu0-sm1"),
		podRes("ns", "userns", "gpu", res, "x-gpu0-sm2"),
		podRes("ns", "gone", "gpu", res, "x-gpu0-sm3"),
	})
	c := RootCheck{PodResources: sock, Pods: pods{
		"ns/root":   podWith(nil, nil, nil, nil),
		"ns/user":   podWith(nil, &corev1.PodSecurityContext{RunAsNonRoot: yes(), RunAsUser: i64(1000)}, noEsc(nil), noEsc(nil)),
		"ns/userns": podWith(no(), nil, nil, nil),
	}}
	ctx := context.Background()
	_, err := c.Check(ctx, res, []string{"x-gpu0-sm0"})
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Ref != (ContainerRef{"ns", "root", "gpu"}) || !strings.Contains(err.Error(), "pod ns/root container gpu refused") || !strings.Contains(err.Error(), "may run as uid 0") {
		t.Errorf("a root pod: %v", err)
	}
	for _, id := range []string{"x-gpu0-sm1", "x-gpu0-sm2"} {
		if _, err := c.Check(ctx, res, []string{id}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	if _, err := c.Check(ctx, res, []string{"x-gpu0-sm3"}); err == nil || errors.As(err, &ref) {
		t.Errorf("a pod the API server does not answer for: %v, want an error that is no refusal", err)
	}
	c.PodResources = filepath.Join(t.TempDir(), "none.sock")
	if _, err := c.Check(ctx, res, []string{"x-gpu0-sm1"}); err == nil || !strings.Contains(err.Error(), "PodResources") {
		t.Errorf("no kubelet: %v", err)
	}
}

// A kubeconfig that is not there yet is an error at each use, not at
// start, and is read once it is there.
func TestLazyAPIServer(t *testing.T) {
	dir := t.TempDir()
	srv, ca := fakeAPIServer(t, map[string]*corev1.Pod{"ns/p": podWith(nil, nil, nil)}, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer t" })
	l := &LazyAPIServer{Kubeconfig: filepath.Join(dir, "kubelet.conf")}
	ctx := context.Background()
	if _, err := l.Pod(ctx, "ns", "p"); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("no kubeconfig yet: %v", err)
	}
	write(t, filepath.Join(dir, "ca.crt"), ca)
	write(t, l.Kubeconfig, []byte("current-context: c\nclusters:\n- name: k\n  cluster: {server: '"+srv.URL+"', certificate-authority: ca.crt}\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user: {token: t}\n"))
	if _, err := l.Pod(ctx, "ns", "p"); err != nil {
		t.Errorf("once the kubeconfig is there: %v", err)
	}
}
