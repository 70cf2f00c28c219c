package mps

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/mpsd/mpsd/internal/mountinfo"
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
		out = append(out, mountEntry{id: id, parent: parent, root: mountinfo.Unescape(f[3]), point: mountinfo.Unescape(f[4]),
			fstype: mountinfo.Unescape(f[sep+1]), source: mountinfo.Unescape(f[sep+2])})
	}
	return out
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
