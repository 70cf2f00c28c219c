package mpsctl

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/mpsd/mpsd/gpu"
)

// noNVML is a host without the NVIDIA driver.
func noNVML() nvml.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
}

// simNVML is a host with n simulated GPUs of model.
func simNVML(t *testing.T, n int, model string) func() nvml.Interface {
	return func() nvml.Interface {
		sim, err := gpu.NewSim(gpu.SimSpec{GPUs: n, Model: model})
		if err != nil {
			t.Fatal(err)
		}
		return sim.NVML()
	}
}

const skippedNote = "mpsctl: note: GPU checks skipped (GPU selectors, memory budgets against the cards, multiuser against the driver): "

func TestCheckConfig(t *testing.T) {
	td := func(name string) string { return filepath.Join("testdata", name) }
	for _, tc := range []struct {
		name string
		args []string
		lib  func() nvml.Interface
		code int
		// stdout is exact; stderr lines must each appear, in order.
		stdout string
		stderr []string
	}{
		{
			name: "valid, simulated", args: []string{"check-config", "--simulate", td("sim.yaml")},
			lib: noNVML, code: ExitOK, stdout: td("sim.yaml") + ": ok\n",
		},
		{
			name: "valid, flag after file", args: []string{"check-config", td("sim.yaml"), "--simulate"},
			lib: noNVML, code: ExitOK, stdout: td("sim.yaml") + ": ok\n",
		},
		{
			name: "valid, no NVML", args: []string{"check-config", td("sim.yaml")},
			lib: noNVML, code: ExitOK, stdout: td("sim.yaml") + ": ok\n",
			stderr: []string{skippedNote + "gpu: NVML unavailable: "},
		},
		{
			name: "valid, host GPUs", args: []string{"check-config", td("sim.yaml")},
			lib: simNVML(t, 2, "a100-40g"), code: ExitOK, stdout: td("sim.yaml") + ": ok\n",
		},
		{
			name: "selector names a GPU the host lacks", args: []string{"check-config", td("sim.yaml")},
			lib: simNVML(t, 1, "h100-80g"), code: ExitFailure,
			stderr: []string{td("sim.yaml") + ": groups.batch.gpus[0]: no GPU with index 1"},
		},
		{
			name: "unknown key", args: []string{"check-config", td("unknown-key.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{
				skippedNote,
				td("unknown-key.yaml") + ": groups.inference.memory: required",
				td("unknown-key.yaml") + ": groups.inference.memroy: unknown key",
			},
		},
		{
			name: "unknown key, simulated", args: []string{"check-config", "--simulate", td("unknown-key.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{
				td("unknown-key.yaml") + ": groups.inference.memory: required",
				td("unknown-key.yaml") + ": groups.inference.memroy: unknown key",
			},
		},
		{
			name: "budget above the simulated card", args: []string{"check-config", "--simulate", td("too-big.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{td("too-big.yaml") + ": groups.inference.memory: 48G more than the 40G memory of GPUs 0, 1"},
		},
		{
			name: "budget above the host's card", args: []string{"check-config", td("too-big.yaml")},
			lib: simNVML(t, 1, "a100-40g"), code: ExitFailure,
			stderr: []string{td("too-big.yaml") + ": groups.inference.memory: 48G more than the 40G memory of GPU 0"},
		},
		{
			name: "budget unchecked without NVML", args: []string{"check-config", td("too-big.yaml")},
			lib: noNVML, code: ExitOK, stdout: td("too-big.yaml") + ": ok\n",
			stderr: []string{skippedNote},
		},
		{
			name: "budget fits a bigger simulated card", args: []string{"check-config", td("too-big.yaml")},
			lib: simNVML(t, 2, "h100-80g"), code: ExitOK, stdout: td("too-big.yaml") + ": ok\n",
		},
		{
			name: "multiuser on a 550 host", args: []string{"check-config", td("multiuser.yaml")},
			lib: simNVML(t, 1, "h100-80g"), code: ExitFailure,
			stderr: []string{td("multiuser.yaml") + ": groups.shared.multiuser: true needs NVIDIA driver 555 or newer (its MPS control daemon's -multiuser-server); this host runs 550.163.01\n"},
		},
		{
			name: "multiuser on a simulated 550 host", args: []string{"check-config", "--simulate", td("multiuser.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{td("multiuser.yaml") + ": groups.shared.multiuser: true needs NVIDIA driver 555 or newer (its MPS control daemon's -multiuser-server); this host runs 550.163.01\n"},
		},
		{
			name: "multiuser on a 570 host", args: []string{"check-config", td("multiuser.yaml")},
			lib: simNVML(t, 1, "a100-40g"), code: ExitOK, stdout: td("multiuser.yaml") + ": ok\n",
		},
		{
			name: "multiuser unchecked without NVML", args: []string{"check-config", td("multiuser.yaml")},
			lib: noNVML, code: ExitOK, stdout: td("multiuser.yaml") + ": ok\n",
			stderr: []string{skippedNote},
		},
		{
			name: "simulation gpu cannot build", args: []string{"check-config", "--simulate", td("bad-sim.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{td("bad-sim.yaml") + ": simulate: gpu: bad simulation spec: gpus: 65"},
		},
		{
			name: "missing file", args: []string{"check-config", td("nope.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{skippedNote, "mpsctl: ", "nope.yaml", "no such file or directory"},
		},
		{
			name: "missing file, simulated", args: []string{"check-config", "--simulate", td("nope.yaml")},
			lib: noNVML, code: ExitFailure,
			stderr: []string{"mpsctl: ", "nope.yaml", "no such file or directory"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// check-config never needs mpsd: the socket named does not exist.
			r := mpsctl(t, Config{NVML: tc.lib}, []string{"MPSD_SOCKET=/nonexistent/s.sock"}, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d; want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout %q; want %q", r.stdout, tc.stdout)
			}
			rest := r.stderr
			for _, want := range tc.stderr {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Errorf("stderr %q lacks %q (in order)", r.stderr, want)
					break
				}
				rest = rest[i+len(want):]
			}
			if len(tc.stderr) == 0 && r.stderr != "" {
				t.Errorf("stderr %q; want nothing", r.stderr)
			}
			if tc.code == ExitFailure && !strings.Contains(r.stderr, "mpsctl: ") {
				for _, l := range strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n") {
					if !strings.HasPrefix(l, tc.args[len(tc.args)-1]+": ") {
						t.Errorf("problem line %q does not start with the file's name", l)
					}
				}
			}
		})
	}
}

// The example config of the repository is valid for the 8-GPU host it
// describes.
func TestCheckConfigExample(t *testing.T) {
	example := filepath.Join("..", "..", "examples", "mpsd.yaml")
	r := mpsctl(t, Config{NVML: simNVML(t, 8, "h100-80g")}, nil, "check-config", example)
	if r.code != ExitOK || r.stdout != example+": ok\n" || r.stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0 and ok", r.code, r.stdout, r.stderr)
	}
}
