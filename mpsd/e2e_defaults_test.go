package mpsd

import (
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// Real uids of the defaults tests; the config names them by number.
const (
	defUIDAlice = 64910 // in every group, with no default
	defUIDBob   = 64911 // in groups a and b, b his default
)

// defGroups: a and b share GPUs 0 and 1; pair has one instance of GPUs 2
// and 3.
const defGroups = `  a:
    users: ["64910", "64911"]
    gpus: ["0", "1"]
    memory: 10G
  b:
    users: ["64910", "64911"]
    default_for: ["64911"]
    gpus: ["0", "1"]
    memory: 10G
  pair:
    users: ["64910"]
    gpus: ["2", "3"]
    gpus_per_instance: 2
    memory: 10G
`

// mpsd chooses nothing a launch did not ask for without saying so: a
// user of several groups names one unless the config gives a default, a
// --gpus other than the group's instance size is refused with the size,
// and a --gpu where the group has no instance names the group's GPUs
// rather than its budgets. Each refusal is one line and exit status 125
// (permanent: mps-launch would fail the same way again).
func TestE2EDefaultsSayWhatTheyChose(t *testing.T) {
	e := newEnvGPUs(t, 4, defGroups, "")
	e.start()
	gpu1 := "" // GPU 1's UUID, which names its instance's pipe directory
	for _, in := range e.waitStatus("the instances up", func(st api.Status) bool { return len(st.Instances) > 0 }).Instances {
		if in.GPUIndex == 1 {
			gpu1 = in.GPUUUID
		}
	}
	if gpu1 == "" {
		t.Fatal("no instance on GPU 1")
	}
	// The command says which group's pipe directory and which GPUs it got.
	show := []string{"--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", `echo "pipe=$CUDA_MPS_PIPE_DIRECTORY gpus=$CUDA_VISIBLE_DEVICES"`}
	for _, tc := range []struct {
		name string
		uid  uint32
		args []string
		code int
		// want: what the one line on stderr names (refused), else what
		// the command printed.
		want []string
	}{
		{"several groups, no default", defUIDAlice, nil, 125,
			[]string{"uid 64910 may use groups a, b, pair and has no default group; choose one with --group NAME", "default_for"}},
		{"several groups, the default", defUIDBob, nil, 0, []string{"/run/b/"}},
		{"several groups, one named", defUIDAlice, []string{"--group", "a"}, 0, []string{"/run/a/"}},
		{"another than the default named", defUIDBob, []string{"--group", "a"}, 0, []string{"/run/a/"}},
		{"the instance size by default", defUIDAlice, []string{"--group", "pair"}, 0, []string{"/run/pair/", "gpus=GPU-", ",GPU-"}},
		{"fewer GPUs than an instance has", defUIDAlice, []string{"--group", "pair", "--gpus", "1"}, 125,
			[]string{"can never fit in group pair: gpus 1: group pair's instances have 2 GPUs each; ask --gpus 2"}},
		{"more GPUs than an instance has", defUIDBob, []string{"--gpus", "2"}, 125,
			[]string{"can never fit in group b: gpus 2: group b's instances have 1 GPU each; ask --gpus 1"}},
		{"a GPU outside the group", defUIDBob, []string{"--gpu", "3"}, 125,
			[]string{"--gpu 3: group b has no instance on these GPUs; its instances are on GPU 0, GPU 1"}},
		{"half of a pair", defUIDAlice, []string{"--group", "pair", "--gpu", "2"}, 125,
			[]string{"--gpu 2: group pair has no instance on these GPUs; its instances are on GPUs 2,3"}},
		{"a GPU of the group", defUIDBob, []string{"--gpu", "1"}, 0, []string{"/run/b/" + gpu1 + "/pipe"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, asUID(e.launch(append(tc.args, show...)...), tc.uid))
			if r.code != tc.code {
				t.Fatalf("uid %d mps-launch %q: exit %d, want %d; stderr %q", tc.uid, tc.args, r.code, tc.code, r.stderr)
			}
			if tc.code != 0 {
				inpOneLine(t, r, tc.want...)
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("the command printed %q, without %q", r.stdout, w)
				}
			}
		})
	}
}
