package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// releasedLine finds a lease's end in mpsd's text log: its line is
// written only once the history file holds the lease.
var releasedLine = regexp.MustCompile(`msg="lease released".* lease=(\S+)`)

// The mpsd binary killed with SIGKILL the moment it logs its 30th release
// while a flood of short launches ends (its history writer in the middle
// of its batches) loses no ended lease it reported: every lease whose "lease released" line it wrote is
// in state_dir/history.jsonl. A torn last line (what a kill between a
// write and its end leaves) is dropped by the next mpsd, which serves the
// history whole, every reported lease in it, and goes on appending.
func TestBinarySIGKILLKeepsHistory(t *testing.T) {
	e := newEnv(t, `  inference:
    users: [root]
    memory: 20G
`)
	start := func() (*exec.Cmd, *proc) {
		t.Helper()
		cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
		cmd.Stderr = e.log
		p := startProc(t, cmd)
		e.waitStatus("both instances up", func(st api.Status) bool { return instancesUp(st, 2) })
		return cmd, p
	}
	// The first mpsd's log is read as it is written: it is killed the
	// moment its 30th release is logged, while the others' records are
	// on their way to the file.
	logr, logw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	mpsd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
	mpsd.Stderr = logw
	p := startProc(t, mpsd)
	_ = logw.Close()
	var reported []string
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		sc := bufio.NewScanner(logr)
		for sc.Scan() {
			_, _ = e.log.Write(append(sc.Bytes(), '\n'))
			if m := releasedLine.FindStringSubmatch(sc.Text()); m != nil {
				reported = append(reported, m[1])
				if len(reported) == 30 {
					_ = mpsd.Process.Signal(syscall.SIGKILL)
				}
			}
		}
	}()
	e.waitStatus("both instances up", func(st api.Status) bool { return instancesUp(st, 2) })

	// Eight launchers in a loop of short jobs each, until mpsd is gone.
	const loops = 8
	stop := make(chan struct{})
	done := make(chan struct{}, loops)
	for range loops {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cmd := exec.Command(filepath.Join(e.bin, "mps-launch"), "--sm", "5", "--mem", "100M", "--", "/bin/true")
				cmd.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
				_ = cmd.Run()
			}
		}()
	}
	select {
	case <-killed:
	case <-time.After(waitFor):
		t.Fatalf("fewer than 30 leases released within %s", waitFor)
	}
	if code := p.wait(t); code != -1 {
		t.Fatalf("mpsd exit %d after SIGKILL, want killed", code)
	}
	close(stop)

	path := filepath.Join(e.dir, "state", "history.jsonl")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	inFile := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		var r api.HistoryRecord
		if json.Unmarshal([]byte(line), &r) == nil {
			inFile[r.Lease] = true
		}
	}
	for _, id := range reported {
		if !inFile[id] {
			t.Errorf("lease %s: mpsd logged its release before the SIGKILL, but the history file lacks it", id)
		}
	}
	t.Logf("%d leases reported released before the SIGKILL, %d records in the file", len(reported), len(inFile))

	// What a kill mid-write leaves: a record cut short.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"lease":"inference-torn","uid":0,"group":"infer`); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	mpsd, p = start()
	for range loops {
		<-done // each launcher's last job ended, once mpsd was back
	}
	var h api.History
	if _, err := client.New(e.socket).Get(context.Background(), api.PathHistory, &h); err != nil {
		t.Fatalf("history after the restart: %v", err)
	}
	served := map[string]bool{}
	for _, r := range h.Records {
		served[r.Lease] = true
	}
	for _, id := range reported {
		if !served[id] {
			t.Errorf("lease %s reported released before the SIGKILL is not in the history mpsd serves after its restart", id)
		}
	}
	if served["inference-torn"] {
		t.Errorf("the torn record is served: %+v", h.Records)
	}
	b, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "inference-torn") || !strings.HasSuffix(string(b), "\n") {
		t.Errorf("history file after the restart still holds the torn record, or ends without a newline")
	}
	if log, _ := os.ReadFile(e.log.Name()); !strings.Contains(string(log), "torn last record") {
		t.Errorf("the next mpsd did not say it dropped the torn record")
	}
	// It goes on appending after the repaired end.
	r := exec.Command(filepath.Join(e.bin, "mps-launch"), "--sm", "5", "--mem", "100M", "--job", "after", "--", "/bin/sh", "-c", "exit 4")
	r.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
	if err := r.Run(); r.ProcessState.ExitCode() != 4 {
		t.Fatalf("a job after the restart: %v; want exit 4", err)
	}
	if _, err := client.New(e.socket).Get(context.Background(), api.PathHistory, &h); err != nil {
		t.Fatal(err)
	}
	last := h.Records[len(h.Records)-1]
	if last.JobID != "after" || last.ExitStatus == nil || *last.ExitStatus != 4 {
		t.Errorf("last record after the restart: %+v; want job after, exit 4", last)
	}
	if err := mpsd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
}
