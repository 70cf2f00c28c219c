package kubernetes

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The admission policy test on a real API server: kube-apiserver and etcd,
// built by hack/build-apiserver.sh, with the test's own certificates,
// free ports on 127.0.0.1 and etcd's data in the test's directory. No
// scheduler, controller manager or kubelet: admission runs when a pod is
// created, whether or not anything would ever run it.
const (
	// apiserverRequireEnv=1 (CI) makes a missing kube-apiserver or etcd a
	// failure instead of a skip.
	apiserverRequireEnv = "MPSD_REQUIRE_APISERVER"
	// apiserverCacheEnv is hack/build-apiserver.sh's cache (the Makefile
	// exports it).
	apiserverCacheEnv = "MPSD_APISERVER_CACHE"
	policyFile        = "mpsd-pod-policy.yaml"
	policyName        = "mpsd-pods-not-host-root"
)

// findAPIServer returns the paths of kube-apiserver and etcd in
// hack/build-apiserver.sh's cache; without them the test skips, or fails
// when MPSD_REQUIRE_APISERVER=1.
func findAPIServer(t *testing.T) (apiserver, etcd string) {
	t.Helper()
	cache := engineCache(apiserverCacheEnv, "apiserver")
	apiserver, etcd = filepath.Join(cache, "kube-apiserver"), filepath.Join(cache, "etcd")
	for _, p := range []string{apiserver, etcd} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			msg := fmt.Sprintf("no %s at %s (run hack/build-apiserver.sh; make test does): %v", filepath.Base(p), p, err)
			if os.Getenv(apiserverRequireEnv) == "1" {
				t.Fatalf("%s (%s=1)", msg, apiserverRequireEnv)
			}
			t.Skip(msg)
		}
	}
	return apiserver, etcd
}

// pki is the test's certificates: a CA, the API server's serving
// certificate for 127.0.0.1, a client certificate in system:masters, and
// a service-account signing key, as PEM files in a directory; it issues
// more client certificates (clientKubeconfig).
type pki struct {
	caFile, serverCert, serverKey, saKey string
	client                               tls.Certificate
	pool                                 *x509.CertPool
	dir                                  string
	ca                                   *x509.Certificate
	caKey                                *ecdsa.PrivateKey
	serial                               int64
}

// newCertKey makes a P-256 key, returned with its PEM.
func newCertKey(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b})
}

// write writes a PEM file into the directory and returns its path.
func (p *pki) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sign issues tmpl for pub, signed by the CA's key (self-signed while
// there is no CA certificate yet), valid for a day.
func (p *pki) sign(t *testing.T, tmpl *x509.Certificate, pub *ecdsa.PublicKey) (*x509.Certificate, []byte) {
	t.Helper()
	p.serial++
	tmpl.SerialNumber = big.NewInt(p.serial)
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
	parent, parentKey := p.ca, p.caKey
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// clientCert issues a client certificate for user cn in groups orgs,
// returned as PEM.
func (p *pki) clientCert(t *testing.T, cn string, orgs ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, keyPEM := newCertKey(t)
	_, certPEM = p.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &key.PublicKey)
	return certPEM, keyPEM
}

// clientKubeconfig issues a client certificate for user cn in groups
// orgs and writes NAME.kubeconfig for it and the API server at server
// into the directory, returning its path.
func (p *pki) clientKubeconfig(t *testing.T, name, server, cn string, orgs ...string) string {
	t.Helper()
	certPEM, keyPEM := p.clientCert(t, cn, orgs...)
	cert, key := p.write(t, name+".crt", certPEM), p.write(t, name+".key", keyPEM)
	return p.write(t, name+".kubeconfig", []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: %[1]s
clusters:
- name: test
  cluster:
    server: %[2]s
    certificate-authority: %[3]s
contexts:
- name: %[1]s
  context: {cluster: test, user: %[1]s}
users:
- name: %[1]s
  user:
    client-certificate: %[4]s
    client-key: %[5]s
`, name, server, p.caFile, cert, key)))
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	p := &pki{pool: x509.NewCertPool(), dir: dir, serial: 1}
	caKey, _ := newCertKey(t)
	p.caKey = caKey // the CA signs itself
	ca, caPEM := p.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "mpsd-policy-test-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, &caKey.PublicKey)
	p.ca = ca
	p.caFile = p.write(t, "ca.crt", caPEM)
	p.pool.AddCert(ca)
	srvKey, srvKeyPEM := newCertKey(t)
	_, srvPEM := p.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &srvKey.PublicKey)
	p.serverCert, p.serverKey = p.write(t, "apiserver.crt", srvPEM), p.write(t, "apiserver.key", srvKeyPEM)
	var err error
	if p.client, err = tls.X509KeyPair(p.clientCert(t, "mpsd-policy-test", "system:masters")); err != nil {
		t.Fatal(err)
	}
	_, saPEM := newCertKey(t)
	p.saKey = p.write(t, "sa.key", saPEM)
	return p
}

// controlProc is etcd or kube-apiserver, run by the test.
type controlProc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan error
}

// startControl starts bin with args, its output in dir/NAME.log, and stops
// it (SIGTERM, then SIGKILL) when the test ends; it dies with the test
// binary too.
func startControl(t *testing.T, dir, bin string, args ...string) *controlProc {
	t.Helper()
	p := &controlProc{name: filepath.Base(bin), log: filepath.Join(dir, filepath.Base(bin)+".log"), done: make(chan error, 1)}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "TMPDIR=" + dir}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("%s did not stop within 20 s of SIGTERM", p.name)
		}
	})
	return p
}

// exited reports whether the process ended, and how.
func (p *controlProc) exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// waitUntil polls ok (which also says what it saw) until it holds; p
// exiting or the deadline fails the test with p's log.
func (p *controlProc) waitUntil(t *testing.T, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(engineWait)
	for {
		done, saw := ok()
		if done {
			return
		}
		if ended, err := p.exited(); ended {
			t.Fatalf("waiting for %s: %s exited: %v\n%s", what, p.name, err, tail(p.log, 4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: last %s\n%s log:\n%s", what, saw, p.name, tail(p.log, 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiClient makes requests of the API server as the test's admin.
type apiClient struct {
	base string
	c    *http.Client
}

// status is a Kubernetes Status (an error's body).
type status struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Code    int    `json:"code"`
}

// do sends body (JSON unless contentType says otherwise) and returns the
// response's status code and body.
func (a *apiClient) do(method, path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType == "" {
		contentType = "application/json"
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// send is do with obj as JSON, failing the test on a transport error.
func (a *apiClient) send(t *testing.T, method, path string, obj any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	code, out, err := a.do(method, path, "", b)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, out
}

// ensure creates obj at path (a collection) unless it exists.
func (a *apiClient) ensure(t *testing.T, path string, obj any) {
	t.Helper()
	if code, out := a.send(t, http.MethodPost, path, obj); code != http.StatusCreated && code != http.StatusConflict {
		t.Fatalf("POST %s: %d %s", path, code, out)
	}
}

// startAPIServer starts etcd and kube-apiserver (the binaries given) in
// dir and returns a client of the API server once it is ready, with
// kube-apiserver's process and the certificates.
func startAPIServer(t *testing.T, dir, apiserverBin, etcdBin string) (*apiClient, *controlProc, *pki) {
	t.Helper()
	certs := newPKI(t, dir)
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	etcd := startControl(t, dir, etcdBin,
		"--name=mpsd-policy-test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=mpsd-policy-test="+peerURL, "--unsafe-no-fsync", "--log-level=warn")
	plain := &http.Client{Timeout: 5 * time.Second}
	etcd.waitUntil(t, "etcd's health", func() (bool, string) {
		resp, err := plain.Get(clientURL + "/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"health":"true"`), fmt.Sprintf("%d %s", resp.StatusCode, b)
	})

	port := freePort(t)
	apiserver := startControl(t, dir, apiserverBin,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file="+certs.serverCert, "--tls-private-key-file="+certs.serverKey,
		"--client-ca-file="+certs.caFile, "--cert-dir="+filepath.Join(dir, "cert-dir"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+certs.saKey, "--service-account-signing-key-file="+certs.saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none", "--authorization-mode=Node,RBAC", "--profiling=false",
		// As clusters run (kubeadm sets it): mpsd's DaemonSet is privileged.
		"--allow-privileged=true")
	a := &apiClient{base: fmt.Sprintf("https://127.0.0.1:%d", port), c: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.pool, Certificates: []tls.Certificate{certs.client}}},
	}}
	t.Cleanup(a.c.CloseIdleConnections)
	apiserver.waitUntil(t, "kube-apiserver's /readyz", func() (bool, string) {
		code, b, err := a.do(http.MethodGet, "/readyz", "", nil)
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, b)
	})
	return a, apiserver, certs
}

// applyPolicy creates each object of the shipped policy file, exactly as
// written (the API server reads YAML), and returns their kinds.
func applyPolicy(t *testing.T, a *apiClient) []string {
	t.Helper()
	src, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]string{
		"ValidatingAdmissionPolicy":        "validatingadmissionpolicies",
		"ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
	}
	var kinds []string
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(src), -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: %v", policyFile, err)
		}
		if tm.Kind == "" {
			continue
		}
		res := resources[tm.Kind]
		if tm.APIVersion != "admissionregistration.k8s.io/v1" || res == "" {
			t.Fatalf("%s: unexpected object %s %s", policyFile, tm.APIVersion, tm.Kind)
		}
		path := "/apis/admissionregistration.k8s.io/v1/" + res
		code, out, err := a.do(http.MethodPost, path, "application/yaml", []byte(doc))
		if err != nil || code != http.StatusCreated {
			t.Fatalf("creating the %s of %s: %d %v %s", tm.Kind, policyFile, code, err, out)
		}
		kinds = append(kinds, tm.Kind)
	}
	return kinds
}

// podName is a case's name as a pod's.
func podName(s string) string {
	return strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(s), "-"), "-")
}

// The shipped admission policy, applied as shipped to a real kube-apiserver
// (v1.37.2, on etcd; it compiles the expressions at creation), refuses at
// creation the pods asking for mpsd.io resources that could run as host
// root, with its message naming the container and the fix, and admits the
// others: the cases TestPolicyAdmitsWhatTheNodeAllows
// evaluates with cel-go, each created through the API (a case with an
// ephemeral container: the pod created without it, then the container
// added through pods/ephemeralcontainers, an UPDATE), then the example pod
// and the DaemonSet's pod.
func TestPolicyOnAPIServer(t *testing.T) {
	apiserverBin, etcdBin := findAPIServer(t)
	dir, err := os.MkdirTemp("", "k8spol")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	a, apiserver, _ := startAPIServer(t, dir, apiserverBin, etcdBin)

	// Namespaces and service accounts (there is no controller manager to
	// make the default ones, which pods need to be admitted).
	ensureNS := func(ns, sa string) {
		t.Helper()
		a.ensure(t, "/api/v1/namespaces", &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: ns}})
		if sa == "" {
			sa = "default"
		}
		a.ensure(t, "/api/v1/namespaces/"+ns+"/serviceaccounts", &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}})
	}
	ensureNS("tenants", "")

	// Before the policy, the API server admits a root pod asking for units.
	probe := policyPod(nil, nil, false, nil)
	probe.Name = "probe"
	if code, out := a.send(t, http.MethodPost, "/api/v1/namespaces/tenants/pods?dryRun=All", probe); code != http.StatusCreated {
		t.Fatalf("without the policy, a root pod asking for units: %d %s; want created", code, out)
	}

	if kinds := applyPolicy(t, a); strings.Join(kinds, ",") != "ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding" {
		t.Fatalf("%s holds %v; want the policy and its binding", policyFile, kinds)
	}
	// The policy takes effect once the API server has seen the policy and
	// its binding: until the probe is refused (a dry run, stored nowhere).
	apiserver.waitUntil(t, "the policy in effect", func() (bool, string) {
		code, out := a.send(t, http.MethodPost, "/api/v1/namespaces/tenants/pods?dryRun=All", probe)
		return code == http.StatusForbidden, fmt.Sprintf("%d %s", code, out)
	})

	// judge checks a request's answer against a case.
	judge := func(what string, code int, out []byte, tc policyCase) {
		t.Helper()
		var st status
		_ = json.Unmarshal(out, &st)
		t.Logf("%s: %d %s", what, code, st.Message)
		switch {
		case !tc.refused && code != http.StatusCreated && code != http.StatusOK:
			t.Errorf("%s: %d %s; want admitted", what, code, out)
		case !tc.refused:
		case code != http.StatusForbidden || st.Reason != "Forbidden":
			t.Errorf("%s: %d %s; want refused (403 Forbidden) by the policy", what, code, out)
		case !strings.Contains(st.Message, "ValidatingAdmissionPolicy '"+policyName+"'") ||
			!strings.Contains(st.Message, "a pod asking for mpsd.io resources must not run as host root: container(s) "+tc.naming+" may run as host root") ||
			!strings.Contains(st.Message, "hostUsers: false"):
			t.Errorf("%s: message %q does not name the policy, the container %s and the fix", what, st.Message, tc.naming)
		}
	}
	for _, tc := range policyCases() {
		pod := tc.pod
		pod.Name = podName(tc.name)
		eph := pod.Spec.EphemeralContainers
		pod.Spec.EphemeralContainers = nil // refused on create, whoever creates it
		path := "/api/v1/namespaces/" + pod.Namespace + "/pods"
		code, out := a.send(t, http.MethodPost, path, pod)
		if eph == nil {
			judge(tc.name, code, out, tc)
			continue
		}
		if code != http.StatusCreated {
			t.Errorf("%s: the pod without its ephemeral containers: %d %s; want created", tc.name, code, out)
			continue
		}
		var created corev1.Pod
		if err := json.Unmarshal(out, &created); err != nil {
			t.Fatal(err)
		}
		created.Spec.EphemeralContainers = eph
		code, out = a.send(t, http.MethodPut, path+"/"+pod.Name+"/ephemeralcontainers", &created)
		judge(tc.name+" (pods/ephemeralcontainers)", code, out, tc)
	}

	// The examples: the example pod and the DaemonSet's pod are admitted.
	o, problems := decode(readExamples(t))
	if len(problems) > 0 {
		t.Fatalf("examples: %v", problems)
	}
	var examples []*corev1.Pod
	for _, p := range o.pods {
		examples = append(examples, p.DeepCopy())
	}
	for _, ds := range o.daemonSets {
		p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: *ds.Spec.Template.ObjectMeta.DeepCopy(), Spec: *ds.Spec.Template.Spec.DeepCopy()}
		p.Name, p.Namespace = "daemonset-"+ds.Name, ds.Namespace
		examples = append(examples, p)
	}
	if len(examples) < 2 {
		t.Fatalf("examples: %d pods and DaemonSets; want the example pod and mpsd's DaemonSet", len(examples))
	}
	for _, p := range examples {
		if p.Namespace == "" {
			p.Namespace = "default"
		}
		ensureNS(p.Namespace, p.Spec.ServiceAccountName)
		if rc := p.Spec.RuntimeClassName; rc != nil { // the RuntimeClass plugin refuses a pod naming none there is
			a.ensure(t, "/apis/node.k8s.io/v1/runtimeclasses", map[string]any{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": map[string]string{"name": *rc}, "handler": *rc})
		}
		code, out := a.send(t, http.MethodPost, "/api/v1/namespaces/"+p.Namespace+"/pods", p)
		judge("example pod "+p.Namespace+"/"+p.Name, code, out, policyCase{})
	}
}
