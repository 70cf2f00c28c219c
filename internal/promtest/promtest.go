package promtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Program names, as the Debian package installs them under usr/bin.
const (
	PromtoolName   = "promtool"
	PrometheusName = "prometheus"
)

// Environment variables the package reads.
const (
	// CacheEnv overrides where hack/fetch-prometheus.sh put the programs.
	CacheEnv = "MPSD_PROMETHEUS_CACHE"
	// RequireEnv set to "1" turns a missing program from a skip into a
	// failure, so CI cannot silently lose the rule tests.
	RequireEnv = "MPSD_REQUIRE_PROMETHEUS"
)

// CacheDir is where hack/fetch-prometheus.sh extracts the package:
// $MPSD_PROMETHEUS_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/prometheus.
func CacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "mpsd", "prometheus")
}

// Path returns the path of the fetched program name (PromtoolName or
// PrometheusName), or why it cannot be used.
func Path(name string) (string, error) {
	path := filepath.Join(CacheDir(), "usr", "bin", name)
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s not fetched: %w", path, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file (mode %v)", path, fi.Mode())
	}
	return path, nil
}

// Version returns the Debian package version of the fetched programs, or "".
func Version() string {
	b, _ := os.ReadFile(filepath.Join(CacheDir(), "VERSION"))
	return strings.TrimSpace(string(b))
}

// PromtoolPath returns the path of the fetched promtool. When it is missing
// the test is skipped with the reason, or fails if MPSD_REQUIRE_PROMETHEUS=1.
func PromtoolPath(tb testing.TB) string {
	tb.Helper()
	return require(tb, PromtoolName)
}

// PrometheusPath returns the path of the fetched prometheus server, as
// PromtoolPath does for promtool.
func PrometheusPath(tb testing.TB) string {
	tb.Helper()
	return require(tb, PrometheusName)
}

func require(tb testing.TB, name string) string {
	tb.Helper()
	path, err := Path(name)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%s required (%s=1): %v (run make fetch-prometheus)", name, RequireEnv, err)
		}
		tb.Skipf("%s not available, skipping: %v (run make fetch-prometheus)", name, err)
	}
	return path
}
