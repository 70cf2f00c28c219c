// Package gpuchecktest runs hack/gpu-check.sh's dry run, so that the
// checks a GPU host runs (hack/gpu-check.sh and the steps it sources) keep
// working between the rare runs on one: the same flow against mpsd
// --simulate, the MPS emulator and stand-ins for the CUDA programs.
package gpuchecktest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// The summary line the script ends with.
var resultLine = regexp.MustCompile(`(?m)^Result: (\d+) PASS, (\d+) FAIL`)

func TestGPUCheckDryRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the dry run's lease cgroups and its tenant uid need root")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"bin/mpsd", "bin/mps-launch", "bin/mpsctl", "bin/emu/mpsemu-client"} {
		if _, err := os.Stat(filepath.Join(root, bin)); err != nil {
			t.Fatalf("%s is missing: run make build first (make test does): %v", bin, err)
		}
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack/gpu-check.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GPU_CHECK_DRY_RUN=1")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	m := resultLine.FindSubmatch(buf.Bytes())
	if err != nil || m == nil {
		t.Fatalf("hack/gpu-check.sh (dry run): %v\n%s", err, tail(buf.Bytes(), 8000))
	}
	pass, _ := strconv.Atoi(string(m[1]))
	fail, _ := strconv.Atoi(string(m[2]))
	// Steps 1 to 8, each with its checks: fewer passes than this means a
	// step stopped checking.
	const minPass = 29
	if fail != 0 || pass < minPass {
		t.Fatalf("hack/gpu-check.sh (dry run): %d PASS, %d FAIL, want at least %d PASS and none failed\n%s", pass, fail, minPass, tail(buf.Bytes(), 8000))
	}
	t.Logf("hack/gpu-check.sh (dry run): %d PASS, 0 FAIL", pass)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
