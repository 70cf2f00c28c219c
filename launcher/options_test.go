package launcher

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

func noEnv(string) string { return "" }

func TestParseArgs(t *testing.T) {
	def := func(mut func(*Options)) Options {
		o := Options{Requeue: -1, Socket: api.DefaultSocket, Command: []string{"./infer"}}
		mut(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want Options
	}{
		{"command only", []string{"./infer"}, nil, def(func(*Options) {})},
		{"command after --", []string{"--", "./infer"}, nil, def(func(*Options) {})},
		{"every flag", []string{"--sm", "30", "--mem", "8G", "--gpus", "2", "--group", "inference", "--requeue", "3",
			"--wait", "90s", "--socket", "/tmp/s.sock", "--quiet", "--", "./infer"}, nil,
			def(func(o *Options) {
				o.SM, o.Mem, o.GPUs, o.Group, o.Requeue, o.Wait, o.Socket, o.Quiet = 30, 8*units.GiB, 2, "inference", 3, 90*time.Second, "/tmp/s.sock", true
			})},
		{"equals form and one dash", []string{"-sm=10", "--mem=1.5G", "./infer"}, nil,
			def(func(o *Options) { o.SM, o.Mem = 10, units.GiB*3/2 })},
		{"sizes are binary", []string{"--mem", "512M", "./infer"}, nil, def(func(o *Options) { o.Mem = 512 * units.MiB })},
		{"GiB", []string{"--mem", "8GiB", "./infer"}, nil, def(func(o *Options) { o.Mem = 8 * units.GiB })},
		{"plain bytes", []string{"--mem", "1048576", "./infer"}, nil, def(func(o *Options) { o.Mem = units.MiB })},
		{"sm bounds", []string{"--sm", "1", "--sm", "100", "./infer"}, nil, def(func(o *Options) { o.SM = 100 })},
		{"no-requeue", []string{"--no-requeue", "./infer"}, nil, def(func(o *Options) { o.Requeue = 0 })},
		{"requeue 0", []string{"--requeue", "0", "./infer"}, nil, def(func(o *Options) { o.Requeue = 0 })},
		{"no-wait", []string{"--no-wait", "./infer"}, nil, def(func(o *Options) { o.NoWait = true })},
		{"socket from environment", []string{"./infer"}, map[string]string{"MPSD_SOCKET": "/e.sock"},
			def(func(o *Options) { o.Socket = "/e.sock" })},
		{"--socket beats environment", []string{"--socket", "/f.sock", "./infer"}, map[string]string{"MPSD_SOCKET": "/e.sock"},
			def(func(o *Options) { o.Socket = "/f.sock" })},
		{"command arguments are not flags", []string{"--sm", "5", "./infer", "--sm", "7", "--"}, nil,
			def(func(o *Options) { o.SM, o.Command = 5, []string{"./infer", "--sm", "7", "--"} })},
		{"dash-led command after --", []string{"--", "-weird"}, nil, def(func(o *Options) { o.Command = []string{"-weird"} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.args, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatalf("ParseArgs(%q): %v", tc.args, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseArgs(%q)\n got %+v\nwant %+v", tc.args, got, tc.want)
			}
		})
	}
}

// TestParseArgsErrors pins the exact one line each bad input gets.
func TestParseArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"sm 0", []string{"--sm", "0", "x"}, `--sm "0": want a whole percentage from 1 to 100`},
		{"sm 101", []string{"--sm", "101", "x"}, `--sm "101": want a whole percentage from 1 to 100`},
		{"sm abc", []string{"--sm", "abc", "x"}, `--sm "abc": want a whole percentage from 1 to 100`},
		{"sm fraction", []string{"--sm=12.5", "x"}, `--sm "12.5": want a whole percentage from 1 to 100`},
		{"mem 8X", []string{"--mem", "8X", "x"}, `--mem "8X": unknown unit "X"; use K, M, G or T (binary), optionally with iB, or none for bytes`},
		{"mem -1G", []string{"--mem", "-1G", "x"}, `--mem "-1G": a size has no sign`},
		{"mem bits", []string{"--mem", "8Gb", "x"}, `--mem "8Gb": "Gb" means bits; sizes are in bytes (GB, GiB)`},
		{"mem 0", []string{"--mem", "0", "x"}, `--mem "0": below 1M, the smallest limit MPS enforces`},
		{"mem too big", []string{"--mem", "99999999999T", "x"}, `--mem "99999999999T": more than 9223372036854775807 bytes`},
		{"gpus 0", []string{"--gpus", "0", "x"}, `--gpus "0": want a whole number of GPUs, 1 or more`},
		{"gpus -1", []string{"--gpus=-1", "x"}, `--gpus "-1": want a whole number of GPUs, 1 or more`},
		{"unknown flag", []string{"--frobnicate", "x"}, `unknown flag --frobnicate (mps-launch --help lists the flags)`},
		{"unknown flag with value", []string{"--frob=1", "x"}, `unknown flag --frob (mps-launch --help lists the flags)`},
		{"missing command", []string{"--sm", "10"}, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"missing command after --", []string{"--sm", "10", "--"}, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"no arguments", nil, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"empty command", []string{"--", ""}, `empty command name`},
		{"value missing at the end", []string{"--sm"}, `--sm needs a value`},
		{"requeue -1", []string{"--requeue", "-1", "x"}, `--requeue "-1": want a whole number of relaunches, 0 or more`},
		{"requeue and no-requeue", []string{"--requeue", "2", "--no-requeue", "x"}, `--requeue and --no-requeue exclude each other`},
		{"wait abc", []string{"--wait", "abc", "x"}, `--wait "abc": want a duration such as 30s, 5m or 1h30m`},
		{"wait negative", []string{"--wait", "-1s", "x"}, `--wait "-1s": want a duration such as 30s, 5m or 1h30m`},
		{"wait 0", []string{"--wait", "0", "x"}, `--wait "0": use --no-wait to not wait, or leave --wait out to wait for ever`},
		{"wait and no-wait", []string{"--wait", "1s", "--no-wait", "x"}, `--wait and --no-wait exclude each other`},
		{"quiet with a value", []string{"--quiet=yes", "x"}, `--quiet takes no value`},
		{"empty group", []string{"--group=", "x"}, `--group: empty group name`},
		{"empty socket", []string{"--socket", "", "x"}, `--socket: empty path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseArgs(tc.args, noEnv)
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("ParseArgs(%q) = %v, want ErrUsage", tc.args, err)
			}
			if got := message(err); got != tc.want {
				t.Errorf("ParseArgs(%q) message\n got %s\nwant %s", tc.args, got, tc.want)
			}
			if ExitCode(err) != ExitFailure {
				t.Errorf("ExitCode = %d, want %d", ExitCode(err), ExitFailure)
			}
		})
	}
}

func TestParseArgsHelp(t *testing.T) {
	for _, a := range []string{"-h", "--help", "-help"} {
		if _, err := ParseArgs([]string{a}, noEnv); !errors.Is(err, errHelp) {
			t.Errorf("ParseArgs(%s) = %v, want errHelp", a, err)
		}
	}
}

func TestOptionsLeaseRequest(t *testing.T) {
	two := 2
	zero := 0
	for _, tc := range []struct {
		name string
		o    Options
		want api.LeaseRequest
	}{
		{"defaults", Options{Requeue: -1, Command: []string{"a"}}, api.LeaseRequest{Command: []string{"a"}}},
		{"everything", Options{SM: 30, Mem: units.GiB, GPUs: 2, Group: "g", Requeue: 2, Wait: time.Second, Command: []string{"a", "b"}},
			api.LeaseRequest{SM: 30, MemBytes: units.GiB, GPUs: 2, Group: "g", RequeueAttempts: &two, WaitMillis: 1000, Command: []string{"a", "b"}}},
		{"no requeue is an explicit 0", Options{Requeue: 0, Command: []string{"a"}}, api.LeaseRequest{RequeueAttempts: &zero, Command: []string{"a"}}},
		{"sub-millisecond wait rounds up", Options{Requeue: -1, Wait: time.Microsecond, Command: []string{"a"}}, api.LeaseRequest{WaitMillis: 1, Command: []string{"a"}}},
		{"1.5ms rounds up", Options{Requeue: -1, Wait: 1500 * time.Microsecond, Command: []string{"a"}}, api.LeaseRequest{WaitMillis: 2, Command: []string{"a"}}},
		{"no-wait", Options{Requeue: -1, NoWait: true, Command: []string{"a"}}, api.LeaseRequest{NoWait: true, Command: []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.o.LeaseRequest()
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("LeaseRequest()\n got %+v\nwant %+v", got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("request is invalid: %v", err)
			}
		})
	}
}

// FuzzParseArgs: any command line either parses into options that make a
// valid request, or fails with one line wrapping ErrUsage.
func FuzzParseArgs(f *testing.F) {
	for _, seed := range []string{
		"--sm\x0030\x00--mem\x008G\x00--\x00./infer",
		"--sm=0\x00x", "--sm\x00101\x00x", "--sm\x00abc\x00x", "--mem\x008X\x00x", "--mem\x00-1G\x00x",
		"--gpus\x000\x00x", "--bogus\x00x", "--sm\x0010", "--wait\x001s\x00--no-wait\x00x",
		"--mem\x001.5G\x00--requeue\x003\x00--wait\x0090s\x00x", "--no-requeue\x00--quiet\x00--\x00-x",
		"--wait\x000.0001ms\x00x", "--mem\x0018446744073709551616\x00x", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		var args []string
		if joined != "" {
			args = strings.Split(joined, "\x00")
		}
		o, err := ParseArgs(args, noEnv)
		if err != nil {
			if !errors.Is(err, ErrUsage) && !errors.Is(err, errHelp) {
				t.Fatalf("ParseArgs(%q) = %v, not a usage error", args, err)
			}
			if strings.Contains(message(err), "\n") && !strings.Contains(joined, "\n") {
				t.Fatalf("message is more than one line: %q", message(err))
			}
			return
		}
		if len(o.Command) == 0 || o.Command[0] == "" || o.Socket == "" {
			t.Fatalf("ParseArgs(%q) = %+v: no command or socket", args, o)
		}
		if o.SM != 0 && (o.SM < 1 || o.SM > 100) || o.Mem != 0 && o.Mem < units.MiB || o.GPUs < 0 || o.Wait < 0 || o.Requeue < -1 {
			t.Fatalf("ParseArgs(%q) = %+v: out of range", args, o)
		}
		if err := o.LeaseRequest().Validate(); err != nil {
			t.Fatalf("ParseArgs(%q) makes an invalid request: %v", args, err)
		}
	})
}

// FuzzMemFlag: --mem agrees with units.ParseSize, the project's one size
// parser, on every input.
func FuzzMemFlag(f *testing.F) {
	for _, s := range []string{"8G", "8GiB", "512M", "1.5G", "1048576", "8X", "-1G", "0", "1.1g", " 2 T ", "9999999999999T", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseArgs([]string{"--mem", s, "x"}, noEnv)
		want, perr := units.ParseSize(s)
		switch {
		case perr != nil || want < units.MiB:
			if err == nil {
				t.Fatalf("--mem %q accepted (%d), ParseSize: %d, %v", s, o.Mem, want, perr)
			}
		case err != nil:
			t.Fatalf("--mem %q refused (%v) but ParseSize gives %d", s, err, want)
		case o.Mem != want:
			t.Fatalf("--mem %q = %d, ParseSize = %d", s, o.Mem, want)
		}
	})
}
