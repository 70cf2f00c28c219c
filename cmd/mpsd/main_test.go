package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--version"}, &stderr, runConfig{stdout: &stdout})
	if want := buildinfo.Read().Line("mpsd") + "\n"; code != 0 || stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("mpsd --version: exit %d, stdout %q, stderr %q; want 0, %q, nothing", code, stdout.String(), stderr.String(), want)
	}
}

func TestKubeletWarnings(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "mpsd.yaml")
	if err := os.WriteFile(cfg, []byte("version: 1\ngroups:\n  pods: {users: [root], memory: 1G, multiuser: true}\n  batch: {users: [root], memory: 1G}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		kf     kubeletFlags
		groups []string
		want   []string
		not    []string
	}{
		{"missing dir, every group", kubeletFlags{enabled: true, dir: filepath.Join(dir, "none")}, nil,
			[]string{"device-plugin directory is not there", `group=batch`}, []string{"group=pods"}},
		{"dir there, multiuser group only", kubeletFlags{enabled: true, dir: dir}, []string{"pods"},
			nil, []string{"device-plugin directory", "not multiuser"}},
		{"dir is a file", kubeletFlags{enabled: true, dir: cfg}, []string{"batch"},
			[]string{"--kubelet-dir is not a directory", "group=batch"}, []string{"group=pods"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.kf.warn(slog.New(slog.NewTextHandler(&b, nil)), cfg, tc.groups)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.not {
				if strings.Contains(b.String(), w) {
					t.Errorf("log has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

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
		{"unknown flag", []string{"--frob"}, 2, "mpsd: unknown flag --frob\nRun 'mpsd --help' for the flags.\n"},
		{"mistyped flag", []string{"--simulte"}, 2, "mpsd: unknown flag --simulte; did you mean --simulate?\nRun 'mpsd --help' for the flags.\n"},
		{"flag without its value", []string{"--config"}, 2, "mpsd: flag --config needs an argument\n"},
		{"stray argument", []string{"extra"}, 2, `unexpected argument "extra"`},
		{"bad log level", []string{"--log-level", "loud"}, 2, `--log-level "loud"`},
		{"bad log format", []string{"--log-format", "xml"}, 2, `--log-format "xml"`},
		{"missing config", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, "none.yaml"},
		{"invalid config", []string{"--config", bad, "--simulate"}, 1, `key=groups.a.memroy problem="unknown key`},
		{"help", []string{"--help"}, 0, "usage: mpsd [--config FILE]"},
		{"help, short", []string{"-h"}, 0, "\nFlags:\n  --config FILE "},
		{"bad kubelet group", []string{"--kubelet-device-plugin", "--kubelet-groups", "a, Bad"}, 2, `--kubelet-groups: deviceplugin: "Bad" is not a group name`},
		{"kubelet groups without the plugin", []string{"--kubelet-groups", "a"}, 2, "--kubelet-groups given without --kubelet-device-plugin"},
		{"kubelet dir without the plugin", []string{"--kubelet-dir", dir, "--kubelet-groups", "a"}, 2, "--kubelet-dir and --kubelet-groups given without --kubelet-device-plugin"},
		{"root check flags without the plugin", []string{"--kubelet-allow-host-root", "--kubelet-kubeconfig", "in-cluster"}, 2, "--kubelet-allow-host-root and --kubelet-kubeconfig given without --kubelet-device-plugin"},
		{"device plugin and DRA", []string{"--kubelet-device-plugin", "--kubelet-dra"}, 2, "--kubelet-device-plugin and --kubelet-dra: give one"},
		{"DRA flags without DRA", []string{"--kubelet-dra-node", "n", "--kubelet-dra-capacity", "whole"}, 2, "--kubelet-dra-capacity and --kubelet-dra-node given without --kubelet-dra"},
		{"DRA flags with the device plugin", []string{"--kubelet-device-plugin", "--kubelet-dra-cdi-dir", dir}, 2, "--kubelet-dra-cdi-dir given without --kubelet-dra"},
		{"device plugin flags with DRA", []string{"--kubelet-dra", "--kubelet-cri", "/run/crio/crio.sock"}, 2, "--kubelet-cri given without --kubelet-device-plugin"},
		{"bad DRA group", []string{"--kubelet-dra", "--kubelet-groups", "Bad"}, 2, `--kubelet-groups: deviceplugin: "Bad" is not a group name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stderr, runConfig{stdout: &stdout})
			// Help goes to stdout, anything else to stderr.
			got := stderr.String()
			if code == 0 {
				got = stdout.String()
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("run(%v) = %d, stdout %q, stderr %q; want %d and %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// A config with several problems is logged at start one problem a
// record, each with its key path, and then one line that says how many,
// in either log format: no record holds a line break (a journal showed
// them as a literal \n), so each problem is a line of its own.
func TestConfigProblemsLoggedOnePerLine(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\nsocket: relative.sock\ngroups:\n  a: {users: [root], memroy: 1G}\nwatchdog: {probe_interval: -1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`key=groups.a.memory problem=required`,
		`key=groups.a.memroy problem="unknown key (did you mean groups.a.memory?)"`,
		`key=socket problem="\"relative.sock\" is not an absolute path"`,
		`key=watchdog.probe_interval problem="-1s: want a positive duration"`,
	}
	for _, tc := range []struct {
		format string
		// field is how a record of the format spells key=value.
		field func(kv string) string
		last  string
	}{
		{"text", func(kv string) string { return kv }, `msg="mpsd cannot start" err="mpsd: invalid config: policy: invalid config ` + bad + `: 4 problems" problems=4`},
		{"json", func(kv string) string {
			// key=K problem=P as JSON's "key":"K","problem":"P".
			k, p, _ := strings.Cut(strings.TrimPrefix(kv, "key="), " problem=")
			if !strings.HasPrefix(p, `"`) {
				p = strconv.Quote(p)
			}
			return `"key":"` + k + `","problem":` + p
		}, `"msg":"mpsd cannot start","err":"mpsd: invalid config: policy: invalid config ` + bad + `: 4 problems","problems":4`},
	} {
		t.Run(tc.format, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(context.Background(), []string{"--config", bad, "--simulate", "--log-format", tc.format}, &stderr, runConfig{}); code != 1 {
				t.Fatalf("run = %d, want 1; stderr %q", code, stderr.String())
			}
			out := stderr.String()
			if strings.Contains(out, `\n`) {
				t.Errorf("a record holds a line break:\n%s", out)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != len(want)+1 {
				t.Fatalf("%d lines, want %d problems and the line that counts them:\n%s", len(lines), len(want), out)
			}
			for i, w := range want {
				if f := tc.field(w); !strings.Contains(lines[i], "config problem") || !strings.Contains(lines[i], f) {
					t.Errorf("line %d: %s\nwant the config problem %s", i+1, lines[i], f)
				}
			}
			if !strings.Contains(lines[len(want)], tc.last) {
				t.Errorf("last line: %s\nwant %s", lines[len(want)], tc.last)
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
	deadline := time.Now().Add(waitFor)
	var st api.Status
	for {
		var err error
		st, err = apiStatus(e.socket)
		if err == nil && len(st.Instances) == 2 && st.Instances[0].DaemonPID > 0 && st.Instances[1].DaemonPID > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mpsd not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
