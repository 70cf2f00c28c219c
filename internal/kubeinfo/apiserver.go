package kubeinfo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultKubeconfig is the kubelet's own kubeconfig on a kubeadm node:
// the node's credentials, which the API server's Node authorizer lets read
// the pods bound to the node.
const DefaultKubeconfig = "/etc/kubernetes/kubelet.conf"

// In-cluster service account files (a DaemonSet's pod).
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	maxPodBytes       = 4 << 20
)

// APIServer reads pods from the Kubernetes API server.
type APIServer struct {
	server string
	client *http.Client
	// token returns the bearer token to send, "" for none; read again
	// for every request (service account tokens and kubelet client
	// certificates rotate).
	token func() (string, error)
}

// kubeconfig is the part of a kubeconfig file APIServer uses.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData string `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         string `json:"client-key-data"`
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
		} `json:"user"`
	} `json:"users"`
}

// NewAPIServer reads the kubeconfig at path (its current context: server,
// certificate authority, client certificate or token; relative paths from
// the file's directory). path "" means in-cluster: the service account of
// the pod mpsd runs in (KUBERNETES_SERVICE_HOST and _PORT, its token and
// CA under /var/run/secrets/kubernetes.io/serviceaccount).
func NewAPIServer(path string) (*APIServer, error) {
	if path == "" {
		return inCluster(serviceAccountDir)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := unmarshalYAMLAsJSON(b, &kc); err != nil {
		return nil, fmt.Errorf("kubeinfo: kubeconfig %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	ctxName := kc.CurrentContext
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == ctxName || ctxName == "" && len(kc.Contexts) == 1 {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if clusterName == "" {
		return nil, fmt.Errorf("kubeinfo: kubeconfig %s: no context %q", path, ctxName)
	}
	a := &APIServer{token: func() (string, error) { return "", nil }}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	found := false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		a.server = strings.TrimSuffix(c.Cluster.Server, "/")
		if c.Cluster.InsecureSkipTLSVerify {
			return nil, fmt.Errorf("kubeinfo: kubeconfig %s: insecure-skip-tls-verify is refused (the pod's spec decides whether it may start)", path)
		}
		pem, err := fileOrData(rel(c.Cluster.CertificateAuthority), c.Cluster.CertificateAuthorityData)
		if err != nil {
			return nil, fmt.Errorf("kubeinfo: kubeconfig %s: certificate authority: %w", path, err)
		}
		if pem != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kubeinfo: kubeconfig %s: no certificate in its certificate authority", path)
			}
			tc.RootCAs = pool
		}
	}
	if !found || a.server == "" {
		return nil, fmt.Errorf("kubeinfo: kubeconfig %s: cluster %q has no server", path, clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		u := u.User
		switch {
		case u.ClientCertificate != "" || u.ClientCertificateData != "":
			certFile, keyFile := rel(u.ClientCertificate), rel(u.ClientKey)
			certData, keyData := u.ClientCertificateData, u.ClientKeyData
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				cert, err := fileOrData(certFile, certData)
				if err != nil {
					return nil, err
				}
				key := cert // kubelet-client-current.pem holds both
				if keyFile != "" || keyData != "" {
					if key, err = fileOrData(keyFile, keyData); err != nil {
						return nil, err
					}
				}
				c, err := tls.X509KeyPair(cert, key)
				return &c, err
			}
			if _, err := tc.GetClientCertificate(nil); err != nil {
				return nil, fmt.Errorf("kubeinfo: kubeconfig %s: client certificate: %w", path, err)
			}
		case u.TokenFile != "":
			file := rel(u.TokenFile)
			a.token = func() (string, error) { return readToken(file) }
		case u.Token != "":
			tok := u.Token
			a.token = func() (string, error) { return tok, nil }
		}
	}
	a.client = newHTTPClient(tc)
	return a, nil
}

func inCluster(dir string) (*APIServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("kubeinfo: not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset) and no kubeconfig given")
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("kubeinfo: no certificate in %s", filepath.Join(dir, "ca.crt"))
	}
	tokenFile := filepath.Join(dir, "token")
	if _, err := readToken(tokenFile); err != nil {
		return nil, err
	}
	return &APIServer{
		server: "https://" + net.JoinHostPort(host, port),
		client: newHTTPClient(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}),
		token:  func() (string, error) { return readToken(tokenFile) },
	}, nil
}

func newHTTPClient(tc *tls.Config) *http.Client {
	return &http.Client{
		Transport: &http.Transport{TLSClientConfig: tc, Proxy: nil, TLSHandshakeTimeout: 10 * time.Second, MaxIdleConns: 2, IdleConnTimeout: time.Minute},
		Timeout:   20 * time.Second,
	}
}

func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("kubeinfo: token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func fileOrData(file, data string) ([]byte, error) {
	if data != "" {
		return base64.StdEncoding.DecodeString(data)
	}
	if file == "" {
		return nil, nil
	}
	return os.ReadFile(file)
}

// Server is the API server's URL.
func (a *APIServer) Server() string { return a.server }

// Pod reads namespace/name.
func (a *APIServer) Pod(ctx context.Context, namespace, name string) (*Pod, error) {
	u := a.server + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	tok, err := a.token()
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the API server at %s: %w", a.server, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPodBytes))
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the API server at %s: %w", a.server, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(b))
		var st struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			msg = st.Message
		}
		return nil, fmt.Errorf("kubeinfo: the API server at %s: get pod %s/%s: %s: %s", a.server, namespace, name, resp.Status, msg)
	}
	pod, err := DecodePod(b)
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the API server at %s: pod %s/%s: %w", a.server, namespace, name, err)
	}
	if pod.Metadata.Namespace != namespace || pod.Metadata.Name != name {
		return nil, fmt.Errorf("kubeinfo: the API server at %s answered pod %s/%s for %s/%s", a.server, pod.Metadata.Namespace, pod.Metadata.Name, namespace, name)
	}
	return pod, nil
}

// InCluster is the kubeconfig value that means the service account of the
// pod mpsd runs in.
const InCluster = "in-cluster"

// LazyAPIServer is an APIServer made at its first use, and again at each
// use until it can be (a kubeconfig that is not there yet at boot, or a
// DaemonSet pod's service account): until then every Pod is an error
// saying why.
type LazyAPIServer struct {
	// Kubeconfig is the kubeconfig file, or InCluster.
	Kubeconfig string

	mu sync.Mutex
	a  *APIServer
}

// Pod reads namespace/name from the API server.
func (l *LazyAPIServer) Pod(ctx context.Context, namespace, name string) (*Pod, error) {
	l.mu.Lock()
	a := l.a
	if a == nil {
		path := l.Kubeconfig
		if path == InCluster {
			path = ""
		}
		var err error
		if a, err = NewAPIServer(path); err != nil {
			l.mu.Unlock()
			return nil, err
		}
		l.a = a
	}
	l.mu.Unlock()
	return a.Pod(ctx, namespace, name)
}

// unmarshalYAMLAsJSON decodes YAML into v by its json tags, as kubectl
// reads a kubeconfig: YAML to a generic value, then JSON. It uses the YAML
// decoder mpsd has already (its config's), not a second one.
func unmarshalYAMLAsJSON(b []byte, v any) error {
	var generic any
	if err := yaml.Unmarshal(b, &generic); err != nil {
		return err
	}
	j, err := json.Marshal(generic)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}
