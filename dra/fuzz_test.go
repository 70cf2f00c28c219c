package dra

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// ParseJobID reads the job ids of every lease in mpsd's status, which
// any member of a group sets: it must never panic, accept only what
// JobID writes, and read back what it wrote.
func FuzzParseJobID(f *testing.F) {
	for _, s := range []string{"dra:uid-alice:0", "dra:0c6b2a6e-5f1d-4c1e-9a0b-0123456789ab:12", "k8s:sm=3", "dra::0", "dra:a:b:1", "dra:x:-1", "dra:x:01", "dra:x:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		uid, n, ok := ParseJobID(s)
		if !ok {
			return
		}
		if n < 0 || uid == "" || strings.ContainsAny(string(uid), ":/") {
			t.Fatalf("ParseJobID(%q) = %q, %d", s, uid, n)
		}
		if back := JobID(uid, n); back != s {
			t.Fatalf("ParseJobID(%q) = %q, %d, which JobID writes %q", s, uid, n, back)
		}
	})
}

func TestParseJobID(t *testing.T) {
	for _, c := range []struct {
		in  string
		uid types.UID
		n   int
		ok  bool
	}{
		{"dra:uid-alice:0", "uid-alice", 0, true},
		{"dra:0c6b2a6e-5f1d-4c1e-9a0b-0123456789ab:3", "0c6b2a6e-5f1d-4c1e-9a0b-0123456789ab", 3, true},
		{"k8s:sm=3", "", 0, false},
		{"dra::0", "", 0, false},
		{"dra:a:b:1", "", 0, false},
		{"dra:x:-1", "", 0, false},
		{"dra:x:01", "", 0, false},
		{"dra:x", "", 0, false},
	} {
		t.Run(c.in, func(t *testing.T) {
			uid, n, ok := ParseJobID(c.in)
			if uid != c.uid || n != c.n || ok != c.ok {
				t.Errorf("ParseJobID(%q) = %q, %d, %v; want %q, %d, %v", c.in, uid, n, ok, c.uid, c.n, c.ok)
			}
		})
	}
}
