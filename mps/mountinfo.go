package mps

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/<pid>/mountinfo (proc(5)).
type mountEntry struct {
	id, parent     int
	root, point    string
	fstype, source string
}

// isShm: a private /dev/shm that MountShm mounted.
func (m *mountEntry) isShm() bool { return m.fstype == "tmpfs" && m.source == ShmSource }

// readMountinfo reads the mounts of the calling thread's mount namespace.
func readMountinfo() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	return parseMountinfo(string(b)), nil
}

// parseMountinfo parses mountinfo lines; a line it cannot read is left out.
func parseMountinfo(s string) []mountEntry {
	var out []mountEntry
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, mountEntry{id: id, parent: parent, root: unescapeMount(f[3]), point: unescapeMount(f[4]),
			fstype: unescapeMount(f[sep+1]), source: unescapeMount(f[sep+2])})
	}
	return out
}

// unescapeMount undoes the kernel's octal escapes of space, tab, newline
// and backslash (\040, \011, \012, \134) in a mountinfo field.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// topMountAt is the mount visible at dir (the last of those stacked on
// it: the one no other mount at dir sits on), as the calling thread sees
// it; nil when dir is no mount point.
func topMountAt(dir string) (*mountEntry, error) {
	ms, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	return topOf(ms, dir), nil
}

func topOf(ms []mountEntry, dir string) *mountEntry {
	var at []*mountEntry
	for i := range ms {
		if ms[i].point == dir {
			at = append(at, &ms[i])
		}
	}
	for _, a := range at {
		covered := false
		for _, b := range at {
			if b.parent == a.id && b != a {
				covered = true
				break
			}
		}
		if !covered {
			return a
		}
	}
	return nil
}
