package buildinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is the module's root, where make build runs.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// ldflags runs make build's hack/ldflags.sh in dir, as if dir were the
// repository's root, and returns what it prints and its error.
func ldflags(t *testing.T, dir string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot(t), "hack", "ldflags.sh"))
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Logf("hack/ldflags.sh in %s: %v: %s", dir, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), err
}

// git runs git in dir with a fixed identity and commit time.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@example.com", "GIT_AUTHOR_DATE=2026-12-01T14:00:00Z", "GIT_COMMITTER_DATE=2026-12-01T14:00:00Z",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestLdflagsFromVersionFile: a tree without git (a release tarball)
// takes its version from VERSION; without one nothing is stamped; a
// VERSION that would break -ldflags' quoting fails the build.
func TestLdflagsFromVersionFile(t *testing.T) {
	const p = "-X github.com/mpsd/mpsd/internal/buildinfo."
	for _, tc := range []struct {
		name    string
		file    string // "" for no VERSION file
		want    string
		wantErr bool
	}{
		{"no VERSION", "", "", false},
		{"version, commit and time", "v1.2.0 0123456789abcdef 2026-12-01T14:00:00Z\n",
			p + "version=v1.2.0 " + p + "commit=0123456789abcdef " + p + "commitTime=2026-12-01T14:00:00Z", false},
		{"version alone, no newline", "v1.2.0", p + "version=v1.2.0 " + p + "commit= " + p + "commitTime=", false},
		{"only the first line counts", "v1.2.0\nsomething else\n", p + "version=v1.2.0 " + p + "commit= " + p + "commitTime=", false},
		{"empty", "\n", "", false},
		{"quote", "v1.2.0'x\n", "", true},
		{"shell", "$(true)\n", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ldflags(t, dir)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("hack/ldflags.sh = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestLdflagsFromGit: in a git work tree the version is git describe's
// (the tag, "-dirty" once the tree has changes), the commit HEAD's, in
// preference to a VERSION file; a tree inside another repository is not
// taken for that repository.
func TestLdflagsFromGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this host: make build stamps from VERSION only")
	}
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("v0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "VERSION")
	git(t, dir, "commit", "-q", "-m", "first")
	git(t, dir, "tag", "v9.9.9")
	head := git(t, dir, "rev-parse", "HEAD")
	const p = "-X github.com/mpsd/mpsd/internal/buildinfo."
	want := p + "version=v9.9.9 " + p + "commit=" + head + " " + p + "commitTime=2026-12-01T14:00:00Z"
	if got, err := ldflags(t, dir); err != nil || got != want {
		t.Errorf("tagged clean tree: %q, %v; want %q", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("v0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want = p + "version=v9.9.9-dirty " + p + "commit=" + head + " " + p + "commitTime=2026-12-01T14:00:00Z"
	if got, err := ldflags(t, dir); err != nil || got != want {
		t.Errorf("tree with a change: %q, %v; want %q", got, err, want)
	}
	sub := filepath.Join(dir, "unpacked")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := ldflags(t, sub); err != nil || got != "" {
		t.Errorf("a directory inside the repository, no VERSION: %q, %v; want nothing", got, err)
	}
}

// TestStampedBinary builds mps-launch as make build does, with
// hack/ldflags.sh's flags for a release tarball's VERSION file, and runs
// its --version: the line names the stamped version and commit, whatever
// the go command recorded itself.
func TestStampedBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary (-short)")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("v1.2.0 0123456789abcdef0123 2026-12-01T14:00:00Z\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags, err := ldflags(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "mps-launch")
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", flags, "-o", bin, "./cmd/mps-launch")
	build.Dir = repoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build does
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("mps-launch --version: %v", err)
	}
	want := "mps-launch v1.2.0 commit 0123456789ab (2026-12-01T14:00:00Z) " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if string(out) != want {
		t.Errorf("mps-launch --version = %q, want %q", out, want)
	}
}

// TestLdflagsAbbrev: the commit in the version has 12 hex digits,
// whatever core.abbrev says or the clone's object count would make git's
// default, so every clone of a commit stamps the same version: after a
// tag and with no tag at all.
func TestLdflagsAbbrev(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this host: make build stamps from VERSION only")
	}
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	git(t, dir, "config", "core.abbrev", "7")
	git(t, dir, "commit", "-q", "--allow-empty", "-m", "first")
	head := git(t, dir, "rev-parse", "HEAD")
	const p = "-X github.com/mpsd/mpsd/internal/buildinfo."
	want := p + "version=" + head[:12] + " " + p + "commit=" + head + " " + p + "commitTime=2026-12-01T14:00:00Z"
	if got, err := ldflags(t, dir); err != nil || got != want {
		t.Errorf("no tag: %q, %v; want %q", got, err, want)
	}
	git(t, dir, "tag", "v9.9.9")
	git(t, dir, "commit", "-q", "--allow-empty", "-m", "second")
	head = git(t, dir, "rev-parse", "HEAD")
	want = p + "version=v9.9.9-1-g" + head[:12] + " " + p + "commit=" + head + " " + p + "commitTime=2026-12-01T14:00:00Z"
	if got, err := ldflags(t, dir); err != nil || got != want {
		t.Errorf("a commit after a tag: %q, %v; want %q", got, err, want)
	}
}
