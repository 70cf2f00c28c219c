package mpsd

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/mps"
)

// multiuser550 is the one line a config with group shared multiuser is
// refused with on the h100-80g model's driver (550.163.01), whose control
// daemon has no -multiuser-server.
const multiuser550 = "groups.shared.multiuser: true needs NVIDIA driver 555 or newer (its MPS control daemon's -multiuser-server); this host runs 550.163.01"

const startFailSolo = `  solo:
    users: ["64031", "64032"]
    memory: 5G
`

const startFailShared = `  shared:
    users: ["64031", "64032"]
    memory: 5G
    multiuser: true
`

// On a host whose driver's MPS cannot run a multiuser group (550), a
// config with one is refused: at start, with the line naming the group,
// the key and the driver; and on reload, where the running config and
// its instance stay as they were.
func TestConfigTheDriverCannotRun(t *testing.T) {
	t.Run("start", func(t *testing.T) {
		e := newEnvGPUs(t, 1, startFailSolo+startFailShared, "")
		e.simulateModel("h100-80g")
		if _, err := New(e.opts); err == nil {
			t.Fatal("mpsd.New took a multiuser group on a 550 driver")
		} else if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), multiuser550) {
			t.Errorf("mpsd.New: %v\nwant ErrConfig with %q", err, multiuser550)
		}
	})

	t.Run("reload", func(t *testing.T) {
		e := newEnvGPUs(t, 1, startFailSolo, "")
		e.simulateModel("h100-80g")
		e.start()
		daemon := e.waitStatus("the solo instance ready", func(st api.Status) bool {
			return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceReady
		}).Instances[0].DaemonPID

		// solo turns multiuser and shared is added: both refused, the
		// config in force stays.
		e.writeConfig(strings.Replace(startFailSolo, "memory: 5G\n", "memory: 5G\n    multiuser: true\n", 1)+startFailShared, "")
		// One record per problem, then the reload's failure with their
		// number.
		e.waitLogLine(`msg="config reload failed; the previous config stays in force"`, "problems=2")
		for _, group := range []string{"shared", "solo"} {
			e.waitLogLine(`msg="config problem"`, "key=groups."+group+".multiuser",
				strings.TrimPrefix(multiuser550, "groups.shared.multiuser: "))
		}
		e.d.mu.Lock()
		reloadOK := e.d.metrics.reloadOK
		e.d.mu.Unlock()
		if reloadOK {
			t.Error("the refused reload counts as a success")
		}
		cfg := e.d.watcher.Config()
		if g, ok := cfg.Group("solo"); !ok || g.Multiuser {
			t.Errorf("config in force after the refused reload: solo %+v (found %v); want it as it was", g, ok)
		}
		if _, ok := cfg.Group("shared"); ok {
			t.Error("the refused reload's group shared is in force")
		}
		st := e.d.Status()
		if len(st.Instances) != 1 || st.Instances[0].Group != "solo" || st.Instances[0].State != api.InstanceReady || st.Instances[0].DaemonPID != daemon {
			t.Errorf("instances after the refused reload: %+v; want solo's, ready, daemon %d", st.Instances, daemon)
		}
	})
}

// An instance whose control daemon does not start shows why in status
// (JSON and mpsctl status's NOTE; a non-admin sees only that there is a
// reason), and once its group leaves the config it is dropped at once,
// its supervisor ended, instead of draining for ever. Here the emulated
// control daemon is 550's on a 570 driver (NVML and the MPS binaries
// disagree), so the multiuser group passes the config check and its
// daemon never starts; the other group's runs on. (mpsd is ready once
// every instance is up: shared comes with a reload.)
func TestStartErrorShownAndNeverStartedInstanceDropped(t *testing.T) {
	e := newEnvGPUs(t, 1, startFailSolo, "")
	sim := e.opts.MPS
	e.opts.MPS = func(base mps.Config, l Layout) (mps.Config, error) {
		c, err := sim(base, l)
		c.Env = append(c.Env, "MPSEMU_DRIVER=550")
		return c, err
	}
	e.start()
	e.writeConfig(startFailSolo+startFailShared, "")
	const cannot = "Cannot find MPS control daemon process"
	st := e.waitStatus("solo ready and shared with its start error", func(st api.Status) bool {
		ready, failed := false, false
		for _, in := range st.Instances {
			ready = ready || in.Group == "solo" && in.State == api.InstanceReady
			failed = failed || in.Group == "shared" && strings.Contains(in.LastStartError, cannot)
		}
		return ready && failed
	})
	var solo api.InstanceStatus
	for _, in := range st.Instances {
		switch in.Group {
		case "solo":
			solo = in
			if in.LastStartError != "" {
				t.Errorf("the ready instance shows a start error: %q", in.LastStartError)
			}
		case "shared":
			if in.State == api.InstanceReady || in.DaemonPID != 0 {
				t.Errorf("shared: state %s, daemon %d; want not ready, no daemon", in.State, in.DaemonPID)
			}
		}
	}

	// The JSON document carries it, and mpsctl status's NOTE.
	var doc api.Status
	if err := json.Unmarshal([]byte(e.admin(t, "status", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, in := range doc.Instances {
		found = found || in.Group == "shared" && strings.Contains(in.LastStartError, cannot)
	}
	if !found {
		t.Errorf("mpsctl status --json: no last_start_error naming %q: %+v", cannot, doc.Instances)
	}
	if out := e.admin(t, "status"); !strings.Contains(out, "start failed: ") || !strings.Contains(out, cannot) {
		t.Errorf("mpsctl status shows no start error:\n%s", out)
	}
	for _, in := range ownView(st, 64031).Instances {
		if in.Group == "shared" && in.LastStartError != hiddenStartError {
			t.Errorf("a non-admin's status shows start error %q; want %q", in.LastStartError, hiddenStartError)
		}
	}
	if n := e.d.supervisors.Load(); n != 2 {
		t.Errorf("%d supervisors; want 2", n)
	}

	// shared leaves the config: its instance, which never started, is
	// gone from status as soon as the reload is applied (not draining
	// and retried), and its supervisor ends; solo is left alone.
	e.writeConfig(startFailSolo, "")
	e.waitStatus("shared's instance dropped", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].Group == "solo"
	})
	waitCond(t, "shared's supervisor ended", func() bool { return e.d.supervisors.Load() == 1 },
		func() string { return fmt.Sprintf("%d supervisors", e.d.supervisors.Load()) })
	e.waitLogLine(`msg="instance dropped: it left the config and its control daemon never started"`, "group=shared")
	st = e.d.Status()
	if len(st.Instances) != 1 || st.Instances[0].State != api.InstanceReady || st.Instances[0].DaemonPID != solo.DaemonPID {
		t.Errorf("instances after the reload: %+v; want solo's alone, ready, daemon %d", st.Instances, solo.DaemonPID)
	}
}
