package kubernetes

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// podSpecServer stands in for the API server of a standalone kubelet: it
// answers GET /api/v1/namespaces/NS/pods/NAME with the pod as pods()
// lists it (the kubelet's own view of its static pods, as a mirror pod
// carries it in a cluster), over TLS, to a client presenting token. It
// writes a kubeconfig for it into dir and returns that file's path.
func podSpecServer(t *testing.T, dir, token string, pods func() ([]corev1.Pod, error)) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"kind":"Status","message":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/")
		if r.Method != http.MethodGet || len(parts) != 3 || parts[1] != "pods" {
			http.Error(w, `{"kind":"Status","message":"not served here"}`, http.StatusNotFound)
			return
		}
		list, err := pods()
		if err != nil {
			http.Error(w, fmt.Sprintf(`{"kind":"Status","message":%q}`, err.Error()), http.StatusServiceUnavailable)
			return
		}
		for _, p := range list {
			if p.Namespace == parts[0] && p.Name == parts[2] {
				_ = json.NewEncoder(w).Encode(p)
				return
			}
		}
		http.Error(w, fmt.Sprintf(`{"kind":"Status","message":"pods %q not found"}`, parts[2]), http.StatusNotFound)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	if err := os.WriteFile(filepath.Join(dir, "apiserver-ca.crt"), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: node
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: apiserver-ca.crt
contexts:
- name: node
  context: {cluster: test, user: node}
users:
- name: node
  user:
    token: %s
`, srv.URL, token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}
