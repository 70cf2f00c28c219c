package launcher

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

func noEnv(string) string { return "" }

func TestParseArgs(t *testing.T) {
	def := func(mut func(*Options)) Options {
		o := Options{Requeue: -1, SlurmJobUID: -1, Socket: api.DefaultSocket, Command: []string{"./infer"}}
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
		{"gpu and job", []string{"--gpu", "0, GPU-1a2b ,3", "--job=run-7", "./infer"}, nil,
			def(func(o *Options) { o.GPUSelect, o.JobID = []string{"0", "GPU-1a2b", "3"}, "run-7" })},
		{"gpu all", []string{"--gpu=all", "./infer"}, nil, def(func(o *Options) { o.GPUSelect = []string{"all"} })},
		{"procs", []string{"--sm", "30", "--procs", "4", "./infer"}, nil, def(func(o *Options) { o.SM, o.Procs = 30, 4 })},
		{"procs as many as sm", []string{"--sm=8", "--procs=8", "./infer"}, nil, def(func(o *Options) { o.SM, o.Procs = 8, 8 })},
		{"procs with the group's sm", []string{"--procs", "48", "./infer"}, nil, def(func(o *Options) { o.Procs = 48 })},
		{"no-slurm outside a job", []string{"--no-slurm", "./infer"}, nil, def(func(o *Options) { o.NoSlurm = true })},
		{"Slurm variables outside a job are not read", []string{"./infer"},
			map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_UID": "1001", "SLURM_STEP_GPUS": "1"},
			def(func(*Options) {})},
		// Inside a Slurm job: what gres/mps, shard and gpu set.
		{"batch script", []string{"./infer"}, map[string]string{"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1001"},
			def(func(o *Options) { o.JobID, o.SlurmJobUID = "42", 1001 })},
		{"step of gres/mps", []string{"./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_JOB_UID": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
			def(func(o *Options) { o.JobID, o.SlurmJobUID, o.SM = "42.0", 0, 50 })},
		{"step of gres/shard", []string{"./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"},
			def(func(o *Options) { o.JobID, o.GPUSelect = "42.3", []string{"1"} })},
		{"step GPUs beat the visible devices", []string{"./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_GPUS": "2,3", "SLURM_JOB_GPUS": "1,2,3", "CUDA_VISIBLE_DEVICES": "0,1"},
			def(func(o *Options) { o.JobID, o.GPUSelect = "42", []string{"2", "3"} })},
		{"job GPUs in the batch script", []string{"./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "1,2", "CUDA_VISIBLE_DEVICES": "0,1"},
			def(func(o *Options) { o.JobID, o.GPUSelect = "42", []string{"1", "2"} })},
		{"visible devices as UUIDs", []string{"./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"},
			def(func(o *Options) { o.JobID, o.GPUSelect = "42", []string{"GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"} })},
		{"NoDevFiles is no GPU list", []string{"./infer"}, map[string]string{"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "NoDevFiles"},
			def(func(o *Options) { o.JobID = "42" })},
		{"flags beat the job's environment", []string{"--sm", "20", "--gpu", "GPU-aa", "--job", "mine", "./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "SLURM_STEP_GPUS": "1"},
			def(func(o *Options) { o.SM, o.GPUSelect, o.JobID = 20, []string{"GPU-aa"}, "mine" })},
		{"a flag hides a bad variable", []string{"--sm", "20", "--gpu", "0", "./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "375", "SLURM_STEP_GPUS": "MIG-1"},
			def(func(o *Options) { o.SM, o.GPUSelect, o.JobID = 20, []string{"0"}, "42" })},
		{"no-slurm ignores the job", []string{"--no-slurm", "./infer"},
			map[string]string{"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "375", "SLURM_STEP_GPUS": "1"},
			def(func(o *Options) { o.NoSlurm = true })},
		{"no-slurm with an explicit job", []string{"--no-slurm", "--job", "42", "./infer"}, map[string]string{"SLURM_JOB_ID": "42"},
			def(func(o *Options) { o.NoSlurm, o.JobID = true, "42" })},
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
		{"procs 0", []string{"--procs", "0", "x"}, `--procs "0": want a whole number of processes from 1 to 48 (MPS serves at most 48 clients per GPU)`},
		{"procs 49", []string{"--procs", "49", "x"}, `--procs "49": want a whole number of processes from 1 to 48 (MPS serves at most 48 clients per GPU)`},
		{"procs abc", []string{"--procs=abc", "x"}, `--procs "abc": want a whole number of processes from 1 to 48 (MPS serves at most 48 clients per GPU)`},
		{"procs over sm", []string{"--sm", "3", "--procs", "4", "x"}, `--procs 4 is more than --sm 3: each process would get under 1% of the SMs (at most 3 processes for --sm 3)`},
		{"gpus -1", []string{"--gpus=-1", "x"}, `--gpus "-1": want a whole number of GPUs, 1 or more`},
		{"unknown flag", []string{"--frobnicate", "x"}, `unknown flag --frobnicate (mps-launch --help lists the flags)`},
		{"unknown flag with value", []string{"--frob=1", "x"}, `unknown flag --frob (mps-launch --help lists the flags)`},
		{"mistyped flag", []string{"--no-wiat", "x"}, `unknown flag --no-wiat; did you mean --no-wait? (mps-launch --help lists the flags)`},
		{"mistyped flag with value", []string{"--memm=8G", "x"}, `unknown flag --memm; did you mean --mem? (mps-launch --help lists the flags)`},
		{"missing command", []string{"--sm", "10"}, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"missing command after --", []string{"--sm", "10", "--"}, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"no arguments", nil, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"empty command", []string{"--", ""}, `empty command name`},
		{"value missing at the end", []string{"--sm"}, `--sm needs a value`},
		{"value missing before --", []string{"--group", "--", "true"}, `--group needs a value`},
		{"requeue -1", []string{"--requeue", "-1", "x"}, `--requeue "-1": want a whole number of relaunches, 0 or more`},
		{"requeue and no-requeue", []string{"--requeue", "2", "--no-requeue", "x"}, `--requeue and --no-requeue exclude each other`},
		{"wait abc", []string{"--wait", "abc", "x"}, `--wait "abc": want a duration such as 30s, 5m or 1h30m`},
		{"wait negative", []string{"--wait", "-1s", "x"}, `--wait "-1s": want a duration such as 30s, 5m or 1h30m`},
		{"wait 0", []string{"--wait", "0", "x"}, `--wait "0": use --no-wait to not wait, or leave --wait out to wait for ever`},
		{"wait and no-wait", []string{"--wait", "1s", "--no-wait", "x"}, `--wait and --no-wait exclude each other`},
		{"quiet with a value", []string{"--quiet=yes", "x"}, `--quiet takes no value`},
		{"empty group", []string{"--group=", "x"}, `--group: empty group name`},
		{"empty socket", []string{"--socket", "", "x"}, `--socket: empty path`},
		{"gpu empty", []string{"--gpu=", "x"}, `--gpu "": entry 1 "": empty`},
		{"gpu empty entry", []string{"--gpu", "0,,1", "x"}, `--gpu "0,,1": entry 2 "": empty`},
		{"gpu MIG", []string{"--gpu", "MIG-1", "x"}, `--gpu "MIG-1": entry 1 "MIG-1": MIG devices cannot be selected; select the whole GPU`},
		{"gpu not a selector", []string{"--gpu", "0,gpu1", "x"}, `--gpu "0,gpu1": entry 2 "gpu1": want "all", an index, a GPU UUID or a UUID prefix`},
		{"gpu too many", []string{"--gpu", strings.Repeat("0,", 64) + "0", "x"}, `--gpu "` + strings.Repeat("0,", 64) + `0": 65 GPUs, more than 64`},
		{"job empty", []string{"--job", "", "x"}, `--job "": empty job id`},
		{"job too long", []string{"--job", strings.Repeat("j", 129), "x"}, `--job "` + strings.Repeat("j", 129) + `": longer than 128 bytes`},
		{"job control character", []string{"--job", "a\tb", "x"}, `--job "a\tb": control characters or not UTF-8`},
		{"job not UTF-8", []string{"--job", "a\xffb", "x"}, `--job "a\xffb": control characters or not UTF-8`},
		{"no-slurm with a value", []string{"--no-slurm=1", "x"}, `--no-slurm takes no value`},
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

// TestParseArgsSlurmErrors: a bad value in a Slurm job's environment is
// refused with one line naming the variable, the flag it stands for and
// the ways out.
func TestParseArgsSlurmErrors(t *testing.T) {
	job := func(kv ...string) map[string]string {
		env := map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}
		for i := 0; i < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		// Slurm 22.05 computes this from the shard count when a node has
		// both gres/mps and gres/shard; 375 is what it set.
		{"thread percentage 375", job("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "375"),
			`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "375": want a whole percentage from 1 to 100 (it is the default of --sm in a Slurm job; give --sm, or --no-slurm)`},
		{"thread percentage 0", job("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "0"),
			`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "0": want a whole percentage from 1 to 100 (it is the default of --sm in a Slurm job; give --sm, or --no-slurm)`},
		{"thread percentage fraction", job("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "12.5"),
			`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "12.5": want a whole percentage from 1 to 100 (it is the default of --sm in a Slurm job; give --sm, or --no-slurm)`},
		{"step GPUs", job("SLURM_STEP_GPUS", "0,x"),
			`SLURM_STEP_GPUS "0,x": entry 2 "x": want "all", an index, a GPU UUID or a UUID prefix (it is the default of --gpu in a Slurm job; give --gpu, or --no-slurm)`},
		{"job GPUs", job("SLURM_JOB_GPUS", "-1"),
			`SLURM_JOB_GPUS "-1": entry 1 "-1": want "all", an index, a GPU UUID or a UUID prefix (it is the default of --gpu in a Slurm job; give --gpu, or --no-slurm)`},
		{"MIG visible", job("CUDA_VISIBLE_DEVICES", "MIG-4f0d"),
			`CUDA_VISIBLE_DEVICES "MIG-4f0d": entry 1 "MIG-4f0d": MIG devices cannot be selected; select the whole GPU (it is the default of --gpu in a Slurm job; give --gpu, or --no-slurm)`},
		{"job id", map[string]string{"SLURM_JOB_ID": "4\n2"},
			`SLURM_JOB_ID "4\n2": control characters or not UTF-8 (it is the default of --job in a Slurm job; give --job, or --no-slurm)`},
		{"job uid", job("SLURM_JOB_UID", "alice"), `SLURM_JOB_UID "alice": want a numeric uid (--no-slurm ignores it)`},
		{"negative job uid", job("SLURM_JOB_UID", "-1"), `SLURM_JOB_UID "-1": want a numeric uid (--no-slurm ignores it)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseArgs([]string{"x"}, func(k string) string { return tc.env[k] })
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("ParseArgs = %v, want ErrUsage", err)
			}
			if got := message(err); got != tc.want {
				t.Errorf("message\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestCheckUID(t *testing.T) {
	for _, tc := range []struct {
		name     string
		jobUID   int
		uid      int
		refusedf string
	}{
		{"outside a job", -1, 1000, ""},
		{"the job's user", 1001, 1001, ""},
		{"root in a user's job", 1001, 0, "SLURM_JOB_UID is 1001 but mps-launch runs as uid 0: the lease would be uid 0's, not the job owner's; " +
			"run it as uid 1001, or give --no-slurm to ignore the Slurm job's environment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Options{SlurmJobUID: tc.jobUID}.CheckUID(tc.uid)
			switch {
			case tc.refusedf == "" && err != nil:
				t.Errorf("CheckUID = %v, want nil", err)
			case tc.refusedf != "" && (!errors.Is(err, ErrUsage) || message(err) != tc.refusedf):
				t.Errorf("CheckUID = %v\nwant %s", err, tc.refusedf)
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
	for _, a := range []string{"--version", "-version"} {
		if _, err := ParseArgs([]string{a}, noEnv); !errors.Is(err, errVersion) {
			t.Errorf("ParseArgs(%s) = %v, want errVersion", a, err)
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
		{"defaults", Options{Requeue: -1, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, Command: []string{"a"}}},
		{"everything", Options{SM: 30, Mem: units.GiB, GPUs: 2, Group: "g", Requeue: 2, Wait: time.Second, Command: []string{"a", "b"}},
			api.LeaseRequest{WillAttach: true, SM: 30, MemBytes: units.GiB, GPUs: 2, Group: "g", RequeueAttempts: &two, WaitMillis: 1000, Command: []string{"a", "b"}}},
		{"no requeue is an explicit 0", Options{Requeue: 0, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, RequeueAttempts: &zero, Command: []string{"a"}}},
		{"sub-millisecond wait rounds up", Options{Requeue: -1, Wait: time.Microsecond, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, WaitMillis: 1, Command: []string{"a"}}},
		{"1.5ms rounds up", Options{Requeue: -1, Wait: 1500 * time.Microsecond, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, WaitMillis: 2, Command: []string{"a"}}},
		{"no-wait", Options{Requeue: -1, NoWait: true, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, NoWait: true, Command: []string{"a"}}},
		{"GPUs and job", Options{Requeue: -1, GPUSelect: []string{"1", "GPU-ab"}, JobID: "42.0", Command: []string{"a"}},
			api.LeaseRequest{WillAttach: true, GPUSelect: []string{"1", "GPU-ab"}, JobID: "42.0", Command: []string{"a"}}},
		{"procs", Options{Requeue: -1, SM: 30, Procs: 4, Command: []string{"a"}}, api.LeaseRequest{WillAttach: true, SM: 30, Procs: 4, Command: []string{"a"}}},
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

// TestShownCommand: the argv a lease request names is display only, and
// mpsd refuses one over api.MaxCommandBytes; a long one is cut to whole
// arguments that fit maxShownCommand and a count of the rest.
func TestShownCommand(t *testing.T) {
	shard := "/data/shard-000000.bin" // 22 bytes
	many := []string{"/bin/true"}
	for range 3000 {
		many = append(many, shard) // 66 KB in all
	}
	long := strings.Repeat("é", maxShownCommand) // 2 bytes a rune
	fits := (maxShownCommand - 64 - len("/bin/true") - 3) / (len(shard) + 3)
	empty := make([]string, 25000) // 25,000 empty arguments: 75 KB of JSON
	for _, tc := range []struct {
		name string
		argv []string
		want []string
	}{
		{"short", []string{"a", "b"}, []string{"a", "b"}},
		{"exactly the limit", []string{strings.Repeat("x", maxShownCommand-3)}, []string{strings.Repeat("x", maxShownCommand-3)}},
		{"many empty arguments", empty, append(slices.Clone(empty[:(maxShownCommand-64)/3]), fmt.Sprintf("…(+%d-more-arguments)", len(empty)-(maxShownCommand-64)/3))},
		{"many arguments", many, append(slices.Clone(many[:1+fits]), fmt.Sprintf("…(+%d-more-arguments)", 3000-fits))},
		{"one argument too many", []string{"/bin/true", strings.Repeat("x", maxShownCommand)}, []string{"/bin/true", "…(+1-more-argument)"}},
		{"a program name too long on its own, cut between runes", []string{"x" + long, "a"},
			[]string{"x" + long[:maxShownCommand-64-2] + "…", "…(+1-more-argument)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkShownCommand(t, tc.argv, tc.want)
		})
	}
	// A program name within three bytes of the budget does not fit with
	// its quotes and comma, but is not over the budget on its own: it is
	// kept whole (cutting it indexed past its end).
	budget := maxShownCommand - 64
	for _, n := range []int{budget - 3, budget - 2, budget - 1, budget, budget + 1} {
		name := strings.Repeat("x", n)
		want := []string{name, "…(+1-more-argument)"}
		if n > budget {
			want[0] = name[:budget] + "…"
		}
		t.Run(fmt.Sprintf("a program name of %d bytes and one more argument", n), func(t *testing.T) {
			checkShownCommand(t, []string{name, strings.Repeat("y", 200)}, want)
		})
	}
}

// FuzzShownCommand: any argv gives a request that names at most
// maxShownCommand bytes of valid UTF-8 (from an argv that is) and passes
// mpsd's validation.
func FuzzShownCommand(f *testing.F) {
	f.Add(maxShownCommand-64-2, 100, 1, "é")
	f.Add(maxShownCommand, 3, 5000, "x")
	f.Fuzz(func(t *testing.T, first, rest, count int, unit string) {
		if first < 0 || rest < 0 || count < 0 || first > 4*maxShownCommand || rest > 4*maxShownCommand || count > 20000 || unit == "" || !utf8.ValidString(unit) {
			return
		}
		argv := []string{strings.Repeat(unit, first/len(unit)+1)}
		for range count {
			argv = append(argv, strings.Repeat(unit, rest/len(unit)))
		}
		checkShownCommand(t, argv, nil)
	})
}

// checkShownCommand checks the Command of argv's lease request: equal to
// want (unless want is nil), within maxShownCommand, UTF-8, and valid.
func checkShownCommand(t *testing.T, argv, want []string) {
	t.Helper()
	got := Options{Requeue: -1, Command: argv}.LeaseRequest()
	if want != nil && !slices.Equal(got.Command, want) {
		t.Errorf("Command of %d arguments:\n got %d: %.200q\nwant %d: %.200q", len(argv), len(got.Command), got.Command, len(want), want)
	}
	n := 0
	for _, a := range got.Command {
		n += len(a) + 3
		if !utf8.ValidString(a) {
			t.Errorf("argument %.40q is not UTF-8", a)
		}
	}
	if n > maxShownCommand {
		t.Errorf("Command is %d bytes of JSON strings, more than %d", n, maxShownCommand)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("request is invalid: %v", err)
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
		"--gpu\x000,GPU-1a\x00--job\x0042.0\x00x", "--gpu\x00,\x00x", "--job\x00\x00x", "--no-slurm\x00x",
		"--sm\x0030\x00--procs\x004\x00x", "--sm\x003\x00--procs\x004\x00x", "--procs\x0049\x00x",
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

// FuzzParseArgsSlurm: whatever a Slurm job's environment holds, ParseArgs
// either makes options that make a valid request or fails with one line
// wrapping ErrUsage.
func FuzzParseArgsSlurm(f *testing.F) {
	f.Add("42", "0", "0", "50", "1", "", "")
	f.Add("42", "", "1001", "375", "", "0,1", "NoDevFiles")
	f.Add("4\x002", "batch", "x", "0", "MIG-1", ",", "GPU-1a2b")
	f.Fuzz(func(t *testing.T, job, step, uid, pct, stepGPUs, jobGPUs, visible string) {
		env := map[string]string{
			EnvSlurmJobID: job, EnvSlurmStepID: step, EnvSlurmJobUID: uid, api.EnvThreadPercentage: pct,
			EnvSlurmStepGPUs: stepGPUs, EnvSlurmJobGPUs: jobGPUs, EnvVisibleDevices: visible,
		}
		o, err := ParseArgs([]string{"x"}, func(k string) string { return env[k] })
		if err != nil {
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("ParseArgs = %v, not a usage error", err)
			}
			all := job + step + uid + pct + stepGPUs + jobGPUs + visible
			if strings.Contains(message(err), "\n") && !strings.Contains(all, "\n") {
				t.Fatalf("message is more than one line: %q", message(err))
			}
			return
		}
		if job != "" && o.JobID == "" {
			t.Fatalf("in job %q without a job id: %+v", job, o)
		}
		if err := o.LeaseRequest().Validate(); err != nil {
			t.Fatalf("env %q makes an invalid request: %v", env, err)
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
