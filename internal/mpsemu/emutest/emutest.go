// Package emutest finds the programs that tests run as MPS: the emulator's
// binaries (built on demand) and NVIDIA's real control daemons fetched by
// hack/fetch-nvidia-mps.sh, and the project's own commands for
// end-to-end tests. It is imported only by tests.
package emutest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Program names, as NVIDIA ships them; the emulator uses the same names so it
// drops in through PATH.
const (
	ControlName = "nvidia-cuda-mps-control"
	ServerName  = "nvidia-cuda-mps-server"
	ClientName  = "mpsemu-client"
)

// Generations are the driver generations the emulator emulates and the
// fetch script tries to fetch, oldest first.
var Generations = []string{"535", "550", "555"}

// EmulatedGenerations are generations only the emulator has here: 580,
// seen on an H200 (docs/gpu-probe) but packaged nowhere a GPU-less
// machine can fetch it. Suites run them on the emulator alone.
var EmulatedGenerations = []string{"580"}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// BinDir returns a directory holding the emulator's programs. It uses
// $MPSEMU_BIN_DIR when set (make test sets it after make build); otherwise it
// builds internal/mpsemu/cmd/... once per test process into a temporary
// directory, so `go test ./...` works on a fresh clone too.
func BinDir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv("MPSEMU_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, ControlName)); err != nil {
			tb.Fatalf("MPSEMU_BIN_DIR=%s has no %s (run make build): %v", dir, ControlName, err)
		}
		return dir
	}
	buildOnce.Do(func() { buildDir, buildErr = build() })
	if buildErr != nil {
		tb.Fatalf("build MPS emulator: %v", buildErr)
	}
	return buildDir
}

func build() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	// Not t.TempDir: the directory serves every test of this process, which
	// has no hook at its end. So each process builds into a directory named
	// by its pid and removes those of processes that are gone.
	parent := filepath.Join(os.TempDir(), "mpsemu-bin")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	pruneGone(parent)
	dir := filepath.Join(parent, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./internal/mpsemu/cmd/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./internal/mpsemu/cmd/...: %w\n%s", err, out)
	}
	return dir, nil
}

// pruneGone removes the build directories of test processes that have exited.
func pruneGone(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, fs.ErrNotExist) {
			os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}

// RealCacheDir is where hack/fetch-nvidia-mps.sh keeps the real binaries.
func RealCacheDir() string {
	if d := os.Getenv("MPSD_NVIDIA_MPS_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "mpsd", "nvidia-mps")
}

// RealControl returns the path of NVIDIA's nvidia-cuda-mps-control of driver
// generation gen ("535", "550", "555"). When it is missing the test is
// skipped with the reason, or fails if MPSD_REQUIRE_REAL_MPS=1 (CI sets it,
// so a broken fetch cannot silently turn the comparison off).
func RealControl(tb testing.TB, gen string) string {
	tb.Helper()
	path, err := RealControlPath(gen)
	if err != nil {
		if os.Getenv("MPSD_REQUIRE_REAL_MPS") == "1" {
			tb.Fatalf("real MPS %s required (MPSD_REQUIRE_REAL_MPS=1): %v", gen, err)
		}
		tb.Skipf("real MPS %s not available, skipping: %v (run make fetch-mps)", gen, err)
	}
	return path
}

// RealControlPath is RealControl without a test: the path or why it is missing.
func RealControlPath(gen string) (string, error) {
	path := filepath.Join(RealCacheDir(), gen, "usr", "bin", ControlName)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s not fetched: %w", path, err)
	}
	return path, nil
}

// RealVersion returns the full package version of a fetched generation, or "".
func RealVersion(gen string) string {
	b, _ := os.ReadFile(filepath.Join(RealCacheDir(), gen, "VERSION"))
	return strings.TrimSpace(string(b))
}

var (
	cmdOnce sync.Once
	cmdDir  string
	cmdErr  error
)

// CmdDir returns a directory holding the project's own commands (mpsd,
// mps-launch, mpsctl) for end-to-end tests: $MPSD_BIN_DIR when set (make
// test points it at bin/), else built once per test process next to the
// emulator's build.
func CmdDir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv("MPSD_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "mps-launch")); err != nil {
			tb.Fatalf("MPSD_BIN_DIR=%s has no mps-launch (run make build): %v", dir, err)
		}
		return dir
	}
	cmdOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			cmdErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		parent := filepath.Join(os.TempDir(), "mpsd-bin")
		if err := os.MkdirAll(parent, 0o755); err != nil {
			cmdErr = err
			return
		}
		pruneGone(parent)
		dir := filepath.Join(parent, strconv.Itoa(os.Getpid()))
		// As make build does: mps-launch without cgo, the rest with it.
		cmd := exec.Command("go", "list", "./cmd/...")
		cmd.Dir = root
		list, err := cmd.Output()
		if err != nil {
			cmdErr = fmt.Errorf("go list ./cmd/...: %w", err)
			return
		}
		pkgs := slices.DeleteFunc(strings.Fields(string(list)), func(p string) bool { return strings.HasSuffix(p, "/cmd/mps-launch") })
		cmd = exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			cmdErr = fmt.Errorf("go build ./cmd/...: %w\n%s", err, out)
			return
		}
		cmd = exec.Command("go", "build", "-o", dir+"/", "./cmd/mps-launch")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			cmdErr = fmt.Errorf("CGO_ENABLED=0 go build ./cmd/mps-launch: %w\n%s", err, out)
			return
		}
		cmdDir = dir
	})
	if cmdErr != nil {
		tb.Fatalf("build commands: %v", cmdErr)
	}
	return cmdDir
}
