package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// dirKeys are the directories mpsd makes and writes as root.
func dirKeys(c *Config) []struct{ key, dir string } {
	return []struct{ key, dir string }{{"run_dir", c.RunDir}, {"state_dir", c.StateDir}, {"log_dir", c.LogDir}}
}

// overlappingDirs reports run_dir, state_dir and log_dir that are the
// same directory or one inside another: each holds files of its own kind
// with its own modes (the state file is root's alone, log and pipe
// directories are opened to group members).
func (d *decoder) overlappingDirs(c *Config) {
	keys := dirKeys(c)
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			if !d.ok(a.key) || !d.ok(b.key) || a.dir == "" || b.dir == "" {
				continue
			}
			if within(a.dir, b.dir) || within(b.dir, a.dir) {
				d.problem(b.key, "%s overlaps %s %s; give each of run_dir, state_dir and log_dir a directory of its own, none inside another", b.dir, a.key, a.dir)
			}
		}
	}
}

// within: dir is p or below it (both clean and absolute).
func within(dir, p string) bool {
	if dir == p {
		return true
	}
	if p != "/" {
		p += "/"
	}
	return strings.HasPrefix(dir, p)
}

// CheckDirs checks on this host, as sshd's StrictModes does, that no one
// but root (or euid, mpsd's own user when it is not root) can change
// run_dir, state_dir, log_dir or the directory that holds the API socket
// (CheckSocketDir), or put something else in their place:
//
//   - a directory that exists is a real directory (not a symlink), owned
//     by root or euid, and writable by neither its group nor others;
//   - every existing ancestor up to / is owned by root or euid and either
//     not writable by group and others or sticky (so /tmp may hold them,
//     but is not one of them); a symlink among them is followed and its
//     target checked the same way.
//
// A directory that does not exist yet is fine: mpsd makes it. Each
// problem is one line with the path, what is wrong and how to fix it, in
// a *ConfigError keyed by the setting.
func CheckDirs(c *Config, euid int) error {
	var ps []Problem
	for _, k := range dirKeys(c) {
		if k.dir == "" || !filepath.IsAbs(k.dir) {
			continue
		}
		if msg := checkDir(k.dir, euid); msg != "" {
			ps = append(ps, Problem{Key: k.key, Message: msg})
		}
	}
	if p, ok := socketDirProblem(c.Socket, euid); ok {
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil
	}
	return &ConfigError{Problems: ps}
}

// CheckSocketDir checks the directory that holds the API socket socket as
// CheckDirs checks run_dir: whoever may change that directory may unlink
// the socket and bind one of their own in its place, and so receive every
// launcher's and mpsctl's requests and answer them as mpsd. The socket
// file itself is mpsd's (or systemd's) to replace; the directory may not
// exist yet (mpsd makes it). A problem is one line keyed "socket" in a
// *ConfigError.
func CheckSocketDir(socket string, euid int) error {
	if p, ok := socketDirProblem(socket, euid); ok {
		return &ConfigError{Problems: []Problem{p}}
	}
	return nil
}

func socketDirProblem(socket string, euid int) (Problem, bool) {
	if socket == "" || !filepath.IsAbs(socket) {
		return Problem{}, false
	}
	msg := checkDir(filepath.Dir(socket), euid)
	if msg == "" {
		return Problem{}, false
	}
	return Problem{Key: "socket", Message: "the directory of " + socket + ": " + msg}, true
}

// checkDir returns what is wrong with dir and its ancestors, or "".
func checkDir(dir string, euid int) string {
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Sprintf("cannot check %s: %v", dir, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, _ := filepath.EvalSymlinks(dir)
		return fmt.Sprintf("%s is a symlink (to %q); give the real directory instead, after checking who may change it", dir, target)
	case !fi.IsDir():
		return fmt.Sprintf("%s is not a directory; remove it or give another path", dir)
	default:
		if msg := ownedBy(dir, fi, euid); msg != "" {
			return msg
		}
		if fi.Mode().Perm()&0o022 != 0 {
			return fmt.Sprintf("%s is writable by its group or by others (mode %s); give mpsd a directory of its own (e.g. under /var/lib or /run), or chmod go-w %s", dir, modeString(fi), dir)
		}
	}
	return checkAncestors(dir, euid, 0)
}

// checkAncestors checks every existing ancestor of p.
func checkAncestors(p string, euid, depth int) string {
	if depth > 8 {
		return fmt.Sprintf("cannot check %s: too many symlinks among its ancestors", p)
	}
	for a := filepath.Dir(p); ; a = filepath.Dir(a) {
		if msg := checkAncestor(a, p, euid, depth); msg != "" {
			return msg
		}
		if a == "/" || a == "." {
			return ""
		}
	}
}

func checkAncestor(a, of string, euid, depth int) string {
	fi, err := os.Lstat(a)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ""
	case err != nil:
		return fmt.Sprintf("cannot check %s, an ancestor of %s: %v", a, of, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		if msg := ownedBy(a, fi, euid); msg != "" {
			return msg
		}
		target, err := filepath.EvalSymlinks(a)
		if err != nil {
			return fmt.Sprintf("cannot check %s, an ancestor of %s: %v", a, of, err)
		}
		if msg := checkAncestor(target, of, euid, depth+1); msg != "" {
			return msg
		}
		return checkAncestors(target, euid, depth+1)
	case !fi.IsDir():
		return fmt.Sprintf("%s, an ancestor of %s, is not a directory", a, of)
	}
	if msg := ownedBy(a, fi, euid); msg != "" {
		return msg
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Sprintf("%s, an ancestor of %s, is writable by its group or by others without the sticky bit (mode %s), so they could put something else in its place; chmod go-w %s or move %s elsewhere", a, of, modeString(fi), a, of)
	}
	return ""
}

// ownedBy: p belongs to root or euid.
func ownedBy(p string, fi fs.FileInfo, euid int) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprintf("cannot check who owns %s", p)
	}
	if st.Uid == 0 || int(st.Uid) == euid {
		return ""
	}
	owner := "root"
	if euid != 0 {
		owner = fmt.Sprintf("root or uid %d", euid)
	}
	return fmt.Sprintf("%s is owned by uid %d, not %s, who could change it; chown root:root %s (after checking what is in it) or give another path", p, st.Uid, owner, p)
}

func modeString(fi fs.FileInfo) string {
	m := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fi.Mode()&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	return fmt.Sprintf("%04o", m)
}
