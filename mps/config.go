package mps

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpsd/mpsd/internal/units"
)

// DefaultControl is the control program's name, looked up on the daemon's PATH.
const DefaultControl = "nvidia-cuda-mps-control"

// Config describes one control daemon instance.
type Config struct {
	// ControlPath is the control program: a name looked up on Env's PATH
	// (then this process's PATH), or a path. Default DefaultControl.
	ControlPath string
	// PipeDir is CUDA_MPS_PIPE_DIRECTORY, LogDir CUDA_MPS_LOG_DIRECTORY;
	// both required, both absolute. The daemon creates only the last element
	// of PipeDir; Start creates both if missing.
	PipeDir string
	LogDir  string
	// Env is the daemon's full environment (KEY=VALUE); its servers inherit
	// it, so it must carry PATH. Nil means this process's environment. The
	// MPS variables above and CUDA_VISIBLE_DEVICES are set by this package.
	Env []string
	// VisibleDevices are GPU UUIDs for CUDA_VISIBLE_DEVICES; empty leaves
	// whatever Env says.
	VisibleDevices []string
	// Multiuser starts the daemon with -multiuser-server.
	Multiuser bool
	// DefaultThreadPercentage, when > 0, is applied with
	// set_default_active_thread_percentage right after start.
	DefaultThreadPercentage float64
	// DefaultPinnedMem maps a device ordinal (as the daemon sees it, i.e. the
	// index in VisibleDevices) to a default pinned memory limit in bytes,
	// applied after start as whole MiB. Values under 1 MiB are invalid.
	DefaultPinnedMem map[int]int64
	// QuitTimeout is the -t of `quit -t` in Stop: how long servers get before
	// the daemon SIGINTs them. Rounded up to whole seconds; default 5s.
	QuitTimeout time.Duration
	// ResumeServerLog and ServerLogOffset, on Adopt: follow server.log
	// from ServerLogOffset (where the previous owner had handled it to), so a
	// fault the server logged meanwhile is still reported. An offset the
	// file no longer reaches (it was rotated or truncated since) reads it
	// from the start. Without ResumeServerLog it is followed from its end.
	ResumeServerLog bool
	ServerLogOffset int64
	// Expect, on Adopt and Reclaim: accept only this daemon (the one a
	// previous owner recorded with Daemon.Identity), that pid with that
	// start time; any other holder of control_lock is refused with an
	// error wrapping ErrNoDaemon and ErrUnverifiedDaemon. Nil accepts the
	// verified holder of control_lock. Start ignores it.
	Expect *DaemonIdentity
	// AnswerTimeout, on Adopt: how long the daemon found has to answer
	// its first probe and the capability check before it counts as hung
	// (an error wrapping ErrTimeout). It starts once the handle's own work
	// (reading the control log) is done, so a slow read of a long log is
	// never taken for a daemon that does not answer. 0: ctx alone bounds
	// the answer.
	AnswerTimeout time.Duration
	// Runner starts the control program; default ExecRunner.
	Runner Runner
	// ProcRoot is where /proc is mounted; default /proc.
	ProcRoot string
	// Logger receives the instance's operational log; default discards.
	Logger *slog.Logger
}

// Runner starts a prepared control-program command. It exists so tests and
// instrumentation can observe or alter every invocation; the package itself
// waits for the command and kills it when its context ends.
type Runner interface {
	Start(cmd *exec.Cmd) error
}

// ExecRunner starts commands as they are.
type ExecRunner struct{}

var _ Runner = ExecRunner{}

// Start implements Runner.
func (ExecRunner) Start(cmd *exec.Cmd) error { return cmd.Start() }

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("mps: invalid config")

// withDefaults validates c and returns a copy with defaults filled in and the
// control program resolved to an absolute path.
func (c Config) withDefaults() (Config, error) {
	if c.PipeDir == "" || !filepath.IsAbs(c.PipeDir) {
		return c, fmt.Errorf("%w: pipe dir %q must be an absolute path", ErrConfig, c.PipeDir)
	}
	if c.LogDir == "" || !filepath.IsAbs(c.LogDir) {
		return c, fmt.Errorf("%w: log dir %q must be an absolute path", ErrConfig, c.LogDir)
	}
	if c.DefaultThreadPercentage < 0 || c.DefaultThreadPercentage > 100 {
		return c, fmt.Errorf("%w: default thread percentage %v outside (0, 100]", ErrConfig, c.DefaultThreadPercentage)
	}
	for dev, b := range c.DefaultPinnedMem {
		if _, err := units.MPSLimit(b); dev < 0 || err != nil {
			return c, fmt.Errorf("%w: default pinned memory %d bytes for device %d (need a device ordinal >= 0 and at least 1 MiB)", ErrConfig, b, dev)
		}
	}
	for _, u := range c.VisibleDevices {
		if u == "" || strings.ContainsAny(u, ", \t\n") {
			return c, fmt.Errorf("%w: visible device %q", ErrConfig, u)
		}
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.ControlPath == "" {
		c.ControlPath = DefaultControl
	}
	p, err := lookPath(c.ControlPath, envValue(c.Env, "PATH"))
	if err != nil {
		return c, fmt.Errorf("%w: control program: %w", ErrConfig, err)
	}
	c.ControlPath = p
	if c.QuitTimeout <= 0 {
		c.QuitTimeout = 5 * time.Second
	}
	if c.Runner == nil {
		c.Runner = ExecRunner{}
	}
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// lookPath resolves name on the daemon's PATH first (that is where its
// servers are found too), then on this process's.
func lookPath(name, daemonPath string) (string, error) {
	if strings.Contains(name, "/") {
		abs, err := filepath.Abs(name)
		if err != nil {
			return "", err
		}
		if err := executable(abs); err != nil {
			return "", err
		}
		return abs, nil
	}
	for _, dir := range filepath.SplitList(daemonPath + string(filepath.ListSeparator) + os.Getenv("PATH")) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: not an executable file", p)
	}
	return nil
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// setEnv returns env with key set to value, removing earlier settings.
func setEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}
