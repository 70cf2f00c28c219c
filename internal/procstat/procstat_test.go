package procstat

import (
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	rest := strings.Repeat(" 0", 47)
	for _, tc := range []struct {
		name, in string
		ok       bool
		want     Stat
	}{
		{"zombie killed", "42 (nvidia-cuda-mps) Z 1" + rest + " 9", true, Stat{Comm: "nvidia-cuda-mps", State: 'Z', PPID: 1, ExitCode: 9, HasStart: true}},
		{"comm with parens", "42 (a) b (c)) S 7", true, Stat{Comm: "a) b (c)", State: 'S', PPID: 7, ExitCode: -1}},
		{"short", "42 (x)", false, Stat{}},
		{"no comm", "42 x S 1", false, Stat{}},
		{"start time after fake comm", "7 (x) S 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5 ) S 9" + strings.Repeat(" 0", 17) + " 777",
			true, Stat{Comm: "x) S 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5 ", State: 'S', PPID: 9, ExitCode: -1, StartTime: 777, HasStart: true}},
		{"start time too big", "1 (x) S 1" + strings.Repeat(" 0", 17) + " 18446744073709551616", false, Stat{}},
	} {
		if got, err := Parse(tc.in); (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s: Parse = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// This process: running, with a start time.
func TestReadSelf(t *testing.T) {
	st, err := Read("/proc", os.Getpid())
	if err != nil || st.Exited() || !st.HasStart || st.StartTime == 0 {
		t.Fatalf("Read(self) = %+v, %v", st, err)
	}
}

// A process's stat is its own to shape through its command name (prctl
// PR_SET_NAME): any line parses without a panic.
func FuzzParse(f *testing.F) {
	f.Add("42 (a) b (c)) S 7" + strings.Repeat(" 0", 47) + " 9")
	f.Add("1 (x")
	f.Fuzz(func(t *testing.T, s string) {
		st, err := Parse(s)
		if err == nil && strings.LastIndexByte(s, ')') < 0 {
			t.Fatalf("parsed %+v from a line without ')'", st)
		}
	})
}
