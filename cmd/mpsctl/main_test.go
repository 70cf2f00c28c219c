package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
	"github.com/mpsd/mpsd/internal/mpsctl"
)

// bin is the real mpsctl, built once for all tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mpsctl-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "mpsctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build mpsctl: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// start starts the built mpsctl with args, $MPSD_SOCKET set to socket
// ("" for none), in an environment without NVML.
func start(t *testing.T, socket string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/nonexistent"}
	if socket != "" {
		cmd.Env = append(cmd.Env, api.EnvSocket+"="+socket)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out, &errb
}

func wait(t *testing.T, cmd *exec.Cmd, out, errb *bytes.Buffer) result {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s: %v", bin, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

func mpsctlRun(t *testing.T, socket string, args ...string) result {
	t.Helper()
	cmd, out, errb := start(t, socket, args...)
	return wait(t, cmd, out, errb)
}

// serve runs h as mpsd on a unix socket and returns the socket.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return socket
}

// fakeMPSD answers status with a one-instance document, drain with a
// refusal, resume and restart with one changed instance, requeue with
// no such lease, and inject-xid as an mpsd on real GPUs does.
func fakeMPSD(t *testing.T) string {
	inst := api.InstanceStatus{
		GPUUUID: "GPU-12345678-aaaa-bbbb-cccc-dddddddddddd", GPUIndex: 0, Group: "inference", State: api.InstanceReady,
		DaemonPID: 10, ServerPIDs: []int{11}, Clients: 1, MaxClients: 48, SMAllocated: 25, SMBudget: 100,
		MemAllocatedBytes: 8 << 30, MemBudgetBytes: 40 << 30,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.PathStatus, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		_ = json.NewEncoder(w).Encode(api.Status{Instances: []api.InstanceStatus{inst}, Leases: []api.LeaseStatus{}, Queue: map[string]int{"inference": 0}})
	})
	mux.HandleFunc("POST "+api.PathDrain, func(w http.ResponseWriter, _ *http.Request) {
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, "uid 1000 is not an mpsd admin")
	})
	mux.HandleFunc("POST "+api.PathResume, func(w http.ResponseWriter, r *http.Request) {
		if _, err := api.DecodeAdminTarget(r.Body); err != nil {
			apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		_ = json.NewEncoder(w).Encode(api.AdminResult{Instances: []api.InstanceStatus{inst}})
	})
	mux.HandleFunc("POST "+api.PathRestart, func(w http.ResponseWriter, r *http.Request) {
		if _, err := api.DecodeAdminTarget(r.Body); err != nil {
			apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		restarted := inst
		restarted.State = api.InstanceRecovering
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		_ = json.NewEncoder(w).Encode(api.AdminResult{Instances: []api.InstanceStatus{restarted}})
	})
	mux.HandleFunc("POST "+api.PathRequeue, func(w http.ResponseWriter, r *http.Request) {
		q, err := api.DecodeRequeueRequest(r.Body)
		if err != nil {
			apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, "no lease "+q.Lease)
	})
	mux.HandleFunc("POST "+api.PathInjectXid, func(w http.ResponseWriter, r *http.Request) {
		if _, err := api.DecodeInjectXidRequest(r.Body); err != nil {
			apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, "inject-xid needs mpsd --simulate")
	})
	return serve(t, mux)
}

func TestExitStatus(t *testing.T) {
	socket := fakeMPSD(t)
	missing := filepath.Join(t.TempDir(), "missing.sock")
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	for path, text := range map[string]string{
		good: "version: 1\nsimulate: {gpus: 2, model: a100-40g}\ngroups:\n  g:\n    users: [root]\n    memory: 16G\n",
		bad:  "version: 1\nsimulate: {gpus: 2, model: a100-40g}\ngroups:\n  g:\n    users: [root]\n    memory: 64G\n",
	} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		socket string
		args   []string
		code   int
		// stdout and stderr: the first line of each; "" for none.
		stdout, stderr string
	}{
		{"status", socket, []string{"status"}, mpsctl.ExitOK, "instances: 1 ready; leases: 0 running, 0 queued; granted: mem 8G of 40G, clients 1 of 48", ""},
		{"status json", "", []string{"--socket", socket, "status", "--json"}, mpsctl.ExitOK, "{", ""},
		{"socket after command", missing, []string{"status", "--socket", socket}, mpsctl.ExitOK, "instances: 1 ready; leases: 0 running, 0 queued; granted: mem 8G of 40G, clients 1 of 48", ""},
		{"resume", socket, []string{"resume", "--gpu", "0"}, mpsctl.ExitOK,
			"resumed gpu 0 (GPU-12345678…) group inference: state ready", ""},
		{"refused", socket, []string{"drain", "--gpu", "0"}, mpsctl.ExitFailure, "", "mpsctl: uid 1000 is not an mpsd admin"},
		{"restart", socket, []string{"restart", "--group", "inference"}, mpsctl.ExitOK,
			"restarting gpu 0 (GPU-12345678…) group inference: state recovering", ""},
		{"requeue of no lease", socket, []string{"requeue", "i-7"}, mpsctl.ExitFailure, "", "mpsctl: no lease i-7"},
		{"bad lease id", socket, []string{"requeue", "a/b"}, mpsctl.ExitUsage, "", `mpsctl: requeue: lease id "a/b"`},
		{"inject-xid without --simulate", socket, []string{"inject-xid", "0", "79", "--pid", "12"}, mpsctl.ExitFailure, "",
			"mpsctl: inject-xid needs mpsd --simulate"},
		{"bad xid", socket, []string{"inject-xid", "0", "x"}, mpsctl.ExitUsage, "", `mpsctl: inject-xid: XID "x"`},
		{"unreachable", missing, []string{"status"}, mpsctl.ExitFailure, "",
			"mpsctl: cannot reach mpsd at " + missing + ": no such file or directory; is it running?"},
		{"no command", socket, nil, mpsctl.ExitUsage, "", "mpsctl: no command given"},
		{"unknown command", socket, []string{"frob"}, mpsctl.ExitUsage, "", `mpsctl: unknown command "frob"`},
		{"missing target", socket, []string{"drain"}, mpsctl.ExitUsage, "", "mpsctl: drain: name --gpu, --group or both"},
		{"help", "", []string{"help"}, mpsctl.ExitOK, "usage: mpsctl [--socket PATH] COMMAND [ARGS]", ""},
		{"--help", "", []string{"--help"}, mpsctl.ExitOK, "usage: mpsctl [--socket PATH] COMMAND [ARGS]", ""},
		{"config ok", missing, []string{"check-config", "--simulate", good}, mpsctl.ExitOK, good + ": ok", ""},
		{"config over the card", missing, []string{"check-config", "--simulate", bad}, mpsctl.ExitFailure, "",
			bad + ": groups.g.memory: 64G more than the 40G memory of GPUs 0, 1"},
		{"config without NVML", missing, []string{"check-config", bad}, mpsctl.ExitOK, bad + ": ok",
			"mpsctl: note: GPU checks skipped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mpsctlRun(t, tc.socket, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d; want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			first := func(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }
			if got := first(r.stdout); got != tc.stdout {
				t.Errorf("stdout starts %q; want %q", got, tc.stdout)
			}
			if got := first(r.stderr); !strings.HasPrefix(got, tc.stderr) || (tc.stderr == "") != (got == "") {
				t.Errorf("stderr starts %q; want %q", got, tc.stderr)
			}
		})
	}
}

// SIGINT while mpsd does not answer ends mpsctl at once, exit 1, rather
// than after the request timeout.
func TestInterrupt(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	socket := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer close(release)
	cmd, out, errb := start(t, socket, "status")
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("no request arrived")
	}
	began := time.Now()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := wait(t, cmd, out, errb)
	if r.code != mpsctl.ExitFailure || time.Since(began) > 5*time.Second {
		t.Errorf("exit %d after %v, stderr %q; want 1 at once", r.code, time.Since(began), r.stderr)
	}
	if want := "mpsctl: GET " + api.PathStatus + " via " + socket + ": interrupted\n"; r.stderr != want {
		t.Errorf("stderr %q; want %q", r.stderr, want)
	}
}

// TestVersion: --version is one line naming the build, in the shape of
// mpsd's and mps-launch's; `mpsctl version` prints the same line and
// mpsd's, and the same line still when mpsd cannot be reached (exit 1).
func TestVersion(t *testing.T) {
	r := mpsctlRun(t, "", "--version")
	line, _, _ := strings.Cut(r.stdout, "\n")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "mpsctl ") || !strings.Contains(r.stdout, " commit ") ||
		strings.Count(r.stdout, "\n") != 1 || r.stderr != "" {
		t.Fatalf("--version: exit %d stdout %q stderr %q, want 0 and one line naming the build", r.code, r.stdout, r.stderr)
	}

	socket := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderAPILevel, "2")
		w.Header().Set(api.HeaderVersion, "v1.2.3")
		if r.URL.Path != api.PathVersion {
			apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, "no "+r.URL.Path)
			return
		}
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		_, _ = w.Write([]byte(`{"version":"v1.2.3","commit":"0123456789abcdef0123","api_level":2,"go_version":"go1.26.0"}`))
	}))
	r = mpsctlRun(t, socket, "version")
	if want := line + "\nmpsd v1.2.3 commit 0123456789ab go1.26.0, API level 2\n"; r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Errorf("version: exit %d stdout %q stderr %q; want 0, %q, nothing", r.code, r.stdout, r.stderr, want)
	}

	r = mpsctlRun(t, filepath.Join(t.TempDir(), "none.sock"), "version")
	if r.code != 1 || r.stdout != line+"\n" || !strings.Contains(r.stderr, "cannot reach mpsd") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("version with no mpsd: exit %d stdout %q stderr %q; want 1, mpsctl's line, one line saying mpsd cannot be reached", r.code, r.stdout, r.stderr)
	}
}
