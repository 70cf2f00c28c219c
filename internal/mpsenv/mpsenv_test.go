package mpsenv

import (
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
)

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func TestClientEnv(t *testing.T) {
	dev, err := NewDevices([]string{"GPU-b", "GPU-a"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient("/run/mpsd/g/GPU-b/pipe", dev, 30, 8<<30+5)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		VisibleDevices:   "GPU-b,GPU-a",
		PipeDirectory:    "/run/mpsd/g/GPU-b/pipe",
		ThreadPercentage: "30",
		PinnedMemLimit:   "0=8192M,1=8192M",
	}
	if got := c.Env(); !maps.Equal(got, want) {
		t.Errorf("Env() = %v, want %v", got, want)
	}
	if err := Check(env(c.Env())); err != nil {
		t.Errorf("Check(NewClient's env) = %v", err)
	}
}

func TestNewDevicesAndClientRefuse(t *testing.T) {
	for _, uuids := range [][]string{nil, {""}, {"0"}, {"1,GPU-a"}, {"GPU-a", "GPU-a"}, {"GPU-a=1"}, {"GPU-"}, {"GPU-a b"}} {
		if _, err := NewDevices(uuids); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewDevices(%q) = %v, want ErrInvalid", uuids, err)
		}
	}
	dev, _ := NewDevices([]string{"GPU-a"})
	for _, tc := range []struct {
		pipe string
		dev  Devices
		sm   int
		mem  int64
	}{
		{"/p", Devices{}, 10, 1 << 30},
		{"p", dev, 10, 1 << 30},
		{"/p/../q", dev, 10, 1 << 30},
		{"/p", dev, 0, 1 << 30},
		{"/p", dev, 101, 1 << 30},
		{"/p", dev, 10, 1<<20 - 1},
		{"/p", dev, 10, -1 << 30},
	} {
		if _, err := NewClient(tc.pipe, tc.dev, tc.sm, tc.mem); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewClient(%q, %v, %d, %d) = %v, want ErrInvalid", tc.pipe, tc.dev, tc.sm, tc.mem, err)
		}
	}
}

// TestCheck: the forms MPS drops or misreads are refused, naming the
// variable; the forms it reads as meant pass.
func TestCheck(t *testing.T) {
	base := func(over map[string]string) map[string]string {
		m := map[string]string{PipeDirectory: "/p", ThreadPercentage: "30", VisibleDevices: "GPU-a", PinnedMemLimit: "0=1024M"}
		for k, v := range over {
			if v == "-" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		over map[string]string
		bad  string // "" passes; else a variable the error names
	}{
		{"the lease's form", nil, ""},
		{"by UUID", map[string]string{PinnedMemLimit: "GPU-a=2G"}, ""},
		{"two devices", map[string]string{VisibleDevices: "GPU-a,GPU-b", PinnedMemLimit: "0=1G,GPU-b=512M"}, ""},
		{"no pinned limit", map[string]string{PinnedMemLimit: "-", VisibleDevices: "-"}, ""},
		{"a device the client does not see", map[string]string{PinnedMemLimit: "0=1024M,1=1024M"}, PinnedMemLimit},
		{"an invisible UUID", map[string]string{PinnedMemLimit: "GPU-z=1024M"}, PinnedMemLimit},
		{"a device twice", map[string]string{PinnedMemLimit: "0=1024M,GPU-a=2G"}, PinnedMemLimit},
		{"a visible device without limit", map[string]string{VisibleDevices: "GPU-a,GPU-b"}, PinnedMemLimit},
		{"T read as MiB", map[string]string{PinnedMemLimit: "0=3T"}, PinnedMemLimit},
		{"fraction", map[string]string{PinnedMemLimit: "0=1.5G"}, PinnedMemLimit},
		{"no value", map[string]string{PinnedMemLimit: "0="}, PinnedMemLimit},
		{"no equals", map[string]string{PinnedMemLimit: "1024M"}, PinnedMemLimit},
		{"padded ordinal", map[string]string{PinnedMemLimit: "00=1G"}, PinnedMemLimit},
		{"no CUDA_VISIBLE_DEVICES", map[string]string{VisibleDevices: "-"}, PinnedMemLimit},
		{"a server index", map[string]string{VisibleDevices: "1"}, VisibleDevices},
		{"a UUID twice", map[string]string{VisibleDevices: "GPU-a,GPU-a", PinnedMemLimit: "0=1G,1=1G"}, VisibleDevices},
		{"no pipe directory", map[string]string{PipeDirectory: "-"}, PipeDirectory},
		{"empty pipe directory", map[string]string{PipeDirectory: ""}, PipeDirectory},
		{"bad percentage", map[string]string{ThreadPercentage: "0"}, ThreadPercentage},
		{"word percentage", map[string]string{ThreadPercentage: "all"}, ThreadPercentage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(env(base(tc.over)))
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tc.bad != "" && !errors.Is(err, ErrFallsOpen):
				t.Fatalf("Check = %v, want ErrFallsOpen", err)
			case tc.bad != "" && !strings.Contains(err.Error(), tc.bad):
				t.Fatalf("Check = %v, want it to name %s", err, tc.bad)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	get := Lookup([]string{"A=1", "AB=2", "A=3", "E="})
	for _, tc := range []struct {
		k, v string
		ok   bool
	}{{"A", "1", true}, {"AB", "2", true}, {"E", "", true}, {"B", "", false}} {
		if v, ok := get(tc.k); v != tc.v || ok != tc.ok {
			t.Errorf("%s = %q, %v; want %q, %v", tc.k, v, ok, tc.v, tc.ok)
		}
	}
}

// FuzzCheck feeds the variables a caller or a tenant controls: never a
// panic, and what passes names only devices the client sees, once each.
func FuzzCheck(f *testing.F) {
	for _, s := range [][2]string{{"GPU-a", "0=1024M"}, {"GPU-a,GPU-b", "0=1G,1=2G"}, {"0", "0=1G"}, {"", ""}, {"GPU-a", "0=1G,1=1G"}, {",", "=,="}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, vis, limits string) {
		err := Check(env(map[string]string{PipeDirectory: "/p", VisibleDevices: vis, PinnedMemLimit: limits}))
		if err != nil {
			if !errors.Is(err, ErrFallsOpen) {
				t.Fatalf("Check = %v, not ErrFallsOpen", err)
			}
			return
		}
		n := len(strings.Split(vis, ","))
		if got := len(strings.Split(limits, ",")); got != n {
			t.Fatalf("passed %d entries for %d devices: %q / %q", got, n, vis, limits)
		}
		for _, e := range strings.Split(limits, ",") {
			k, _, _ := strings.Cut(e, "=")
			if i, err := strconv.Atoi(k); err == nil && (i < 0 || i >= n) {
				t.Fatalf("passed entry %q for %d devices", e, n)
			}
		}
	})
}

// FuzzNewClient: whatever NewClient accepts, Check accepts.
func FuzzNewClient(f *testing.F) {
	f.Add("GPU-a,GPU-b", "/p", 30, int64(8<<30))
	f.Fuzz(func(t *testing.T, uuids, pipe string, sm int, mem int64) {
		dev, err := NewDevices(strings.Split(uuids, ","))
		if err != nil {
			return
		}
		c, err := NewClient(pipe, dev, sm, mem)
		if err != nil {
			return
		}
		if err := Check(env(c.Env())); err != nil {
			t.Fatalf("NewClient(%q, %q, %d, %d) made an environment Check refuses: %v", uuids, pipe, sm, mem, err)
		}
	})
}

// TestWorkerPercentage: a share divided among its processes is rounded
// down, so that together they never take more; a division that would
// leave a process under 1% is refused.
func TestWorkerPercentage(t *testing.T) {
	for _, tc := range []struct {
		sm, procs, want int
	}{
		{30, 1, 30}, {30, 4, 7}, {100, 48, 2}, {8, 8, 1}, {1, 1, 1}, {100, 3, 33},
		{8, 9, 0}, {30, 0, 0}, {30, -1, 0}, {0, 1, 0}, {101, 1, 0},
	} {
		got, err := WorkerPercentage(tc.sm, tc.procs)
		switch {
		case tc.want == 0 && !errors.Is(err, ErrInvalid):
			t.Errorf("WorkerPercentage(%d, %d) = %d, %v; want ErrInvalid", tc.sm, tc.procs, got, err)
		case tc.want != 0 && (err != nil || got != tc.want):
			t.Errorf("WorkerPercentage(%d, %d) = %d, %v; want %d", tc.sm, tc.procs, got, err, tc.want)
		case tc.want != 0 && got*tc.procs > tc.sm:
			t.Errorf("WorkerPercentage(%d, %d) = %d: %d processes take more than %d", tc.sm, tc.procs, got, tc.procs, tc.sm)
		}
	}
	if _, err := WorkerPercentage(8, 9); err == nil || !strings.Contains(err.Error(), "at most 8 processes") {
		t.Errorf("WorkerPercentage(8, 9) = %v, want it to name the bound", err)
	}
}

// TestCheckShare: a client of a divided share is held to it; a missing
// percentage (the server's default) or a larger one falls open.
func TestCheckShare(t *testing.T) {
	for _, tc := range []struct {
		pct string // "-": unset
		ok  bool
	}{
		{"7", true}, {"6.5", true}, {"1", true}, {"8", false}, {"30", false}, {"-", false}, {"0", false}, {"", false}, {"x", false},
	} {
		vars := map[string]string{PipeDirectory: "/p", ThreadPercentage: tc.pct}
		if tc.pct == "-" {
			delete(vars, ThreadPercentage)
		}
		err := CheckShare(env(vars), 7)
		if tc.ok != (err == nil) || err != nil && (!errors.Is(err, ErrFallsOpen) || !strings.Contains(err.Error(), ThreadPercentage)) {
			t.Errorf("CheckShare(%s=%q, 7) = %v; want ok %v (else ErrFallsOpen naming the variable)", ThreadPercentage, tc.pct, err, tc.ok)
		}
	}
}

// FuzzWorkerPercentage: whatever share WorkerPercentage gives, the
// environment NewClient makes of it passes Check and CheckShare, and the
// processes together hold no more than the lease's share.
func FuzzWorkerPercentage(f *testing.F) {
	f.Add(30, 4)
	f.Fuzz(func(t *testing.T, sm, procs int) {
		pct, err := WorkerPercentage(sm, procs)
		if err != nil {
			return
		}
		if pct < 1 || pct*procs > sm {
			t.Fatalf("WorkerPercentage(%d, %d) = %d", sm, procs, pct)
		}
		dev, _ := NewDevices([]string{"GPU-a"})
		c, err := NewClient("/p", dev, pct, 1<<30)
		if err != nil {
			t.Fatalf("NewClient refused WorkerPercentage(%d, %d) = %d: %v", sm, procs, pct, err)
		}
		if err := Check(env(c.Env())); err != nil {
			t.Fatal(err)
		}
		if err := CheckShare(env(c.Env()), pct); err != nil {
			t.Fatal(err)
		}
	})
}
