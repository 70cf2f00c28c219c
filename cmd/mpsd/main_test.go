package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

func TestMainUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\ngroups: {a: {memroy: 1G}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"--frob"}, 2, "flag provided but not defined: -frob"},
		{"stray argument", []string{"extra"}, 2, `unexpected argument "extra"`},
		{"bad log level", []string{"--log-level", "loud"}, 2, `--log-level "loud"`},
		{"bad log format", []string{"--log-format", "xml"}, 2, `--log-format "xml"`},
		{"missing config", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, "none.yaml"},
		{"invalid config", []string{"--config", bad, "--simulate"}, 1, "groups.a.memroy: unknown key"},
		{"help", []string{"--help"}, 0, "usage: mpsd"},
		{"bad kubelet group", []string{"--kubelet-device-plugin", "--kubelet-groups", "a, Bad"}, 2, `--kubelet-groups: deviceplugin: "Bad" is not a group name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stderr, runConfig{})
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("run(%v) = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// The mpsd binary stops on SIGTERM with status 0 and leaves the MPS
// daemons running for the next mpsd to adopt.
func TestBinarySIGTERM(t *testing.T) {
	e := newEnv(t, oneGroup)
	cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
	cmd.Stderr = e.log
	p := startProc(t, cmd)
	c := apiClient(e.socket)
	deadline := time.Now().Add(waitFor)
	var st api.Status
	for {
		resp, err := c.Get("http://mpsd" + api.PathStatus)
		if err == nil {
			err = jsonDecode(resp.Body, &st)
			_ = resp.Body.Close()
			if err == nil && len(st.Instances) == 2 && st.Instances[0].DaemonPID > 0 && st.Instances[1].DaemonPID > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("mpsd not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.CloseIdleConnections()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("mpsd exit %d after SIGTERM", code)
	}
	for _, in := range st.Instances {
		if err := syscall.Kill(in.DaemonPID, 0); err != nil {
			t.Errorf("MPS control daemon %d gone after mpsd's SIGTERM: %v", in.DaemonPID, err)
		}
	}
}
