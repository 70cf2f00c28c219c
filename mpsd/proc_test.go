package mpsd

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseProcStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     string
		want   procStatus
		errHas string
	}{
		{"typical", "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nPPid:\t4242\nUid:\t1001\t1001\t1001\t1001\nGid:\t100\t100\t100\t100\nGroups:\t10 3000 \n",
			procStatus{ppid: 4242, uid: 1001, groups: []uint32{10, 3000}}, ""},
		{"no groups", "PPid:\t1\nUid:\t0\t0\t0\t0\nGroups:\t\n", procStatus{ppid: 1, uid: 0}, ""},
		{"real uid counts, not effective", "PPid:\t7\nUid:\t1001\t0\t0\t0\n", procStatus{ppid: 7, uid: 1001}, ""},
		{"no PPid", "Uid:\t0\t0\t0\t0\n", procStatus{}, "no PPid"},
		{"bad uid", "PPid:\t1\nUid:\tx\n", procStatus{}, "bad Uid"},
		{"negative ppid", "PPid:\t-1\nUid:\t1\n", procStatus{}, "bad PPid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStatus(strings.NewReader(tc.in))
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want %q", err, tc.errHas)
				}
				return
			}
			if err != nil || got.ppid != tc.want.ppid || got.uid != tc.want.uid || !slices.Equal(got.groups, tc.want.groups) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// The live file of this process parses, with this process's parent.
func TestReadProcStatusSelf(t *testing.T) {
	st, err := readProcStatus("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.ppid != os.Getppid() || st.uid != uint32(os.Getuid()) {
		t.Errorf("got %+v, want ppid %d uid %d", st, os.Getppid(), os.Getuid())
	}
	if _, err := readProcStatus("/proc", 1<<30); err == nil {
		t.Error("a pid that does not exist parsed")
	}
}

func FuzzParseProcStatus(f *testing.F) {
	f.Add("PPid:\t1\nUid:\t0\t0\t0\t0\nGroups:\t1 2\n")
	f.Add("PPid:\n")
	f.Fuzz(func(t *testing.T, in string) {
		st, err := parseProcStatus(strings.NewReader(in))
		if err == nil && st.ppid < 0 {
			t.Fatalf("negative ppid accepted: %+v", st)
		}
	})
}
