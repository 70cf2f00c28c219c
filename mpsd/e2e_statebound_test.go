package mpsd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Attacker tests of what a tenant can make mpsd write into state_dir
// (docs/security.md, rule 21). Uids 64520-64529 are this file's.
const stateChurnUID = 64520 // a member of group a who queues and churns

// The bounds docs/architecture.md#the-state-file promises, written out
// here rather than taken from the code, so that the code is held to the
// document.
const (
	// docQueueSaveDelay: changes to queued requests alone make at most
	// one write per this much time.
	docQueueSaveDelay = time.Second
	// docKeptCommand: the most bytes a lease's command takes in the
	// state file (its JSON encoding).
	docKeptCommand = 512
	// docLeaseRecord: the most bytes a lease's record takes in the state
	// file, whatever its tenant asked for.
	docLeaseRecord = 2560
)

// stateMeter counts what the store writes into the state directory, from
// the files themselves: the journal's growth, and the state file each
// time a compaction replaces it. Sampled before every write (the store's
// hook) and when the test reads it, so no write goes uncounted.
type stateMeter struct {
	mu     sync.Mutex
	path   string // the state file
	writes int    // writes begun (samples by the hook)
	bytes  int64
	lastJ  int64
	ino    uint64
}

// before is the store's hook: a write is about to begin.
func (m *stateMeter) before() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes++
	m.sampleLocked()
}

// read is how many writes have begun and the bytes written so far.
func (m *stateMeter) read() (writes int, bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sampleLocked()
	return m.writes, m.bytes
}

func (m *stateMeter) sampleLocked() {
	var j, size int64
	var ino uint64
	if fi, err := os.Stat(m.path + journalSuffix); err == nil {
		j = fi.Size()
	}
	if fi, err := os.Stat(m.path); err == nil {
		size, ino = fi.Size(), fi.Sys().(*syscall.Stat_t).Ino
	}
	switch {
	case ino != m.ino:
		// Compacted: a new state file, and the journal emptied since
		// (what it holds now was appended after).
		m.bytes += size + j
	case j >= m.lastJ:
		m.bytes += j - m.lastJ
	}
	m.lastJ, m.ino = j, ino
}

// A member holds the room of its group's instance with one lease, queues
// 8 requests whose command is 16 KiB of '<' (which JSON spells in six
// bytes each: 96 KiB per request), then makes 150 more requests one after
// the other and closes each once mpsd has answered it. Every request and
// close changed the queue, and mpsd wrote the whole state for each: the
// loop made mpsd write hundreds of megabytes. Now a command is kept cut
// to 512 bytes of JSON, a lease's record stays under 2.5 KiB, and changes
// to queued requests alone make at most one write a second: the bytes
// the loop makes mpsd write are bounded by the seconds it runs times the
// state's bound, whatever its pace. The queue is still saved: the state
// file ends up holding every request the member holds.
func TestStateChurnIsBounded(t *testing.T) {
	const hold, cycles = 8, 150
	name := emutest.User(t, stateChurnUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    gpus: ["0"]
`, name), "")
	m := &stateMeter{path: filepath.Join(e.dir, "state", "state.json")}
	e.opts.writeHook = m.before
	e.start()
	prog := e.buildTestProgram("statechurn")

	cmd := asUID(exec.Command(prog, "-socket", e.socket, "-group", "a", "-hold", fmt.Sprint(hold), "-cycles", fmt.Sprint(cycles)), stateChurnUID)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	next := func(want string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || l != want {
				t.Fatalf("statechurn said %q (ended: %v), want %q; stderr %q", l, !ok, want, stderr.String())
			}
		case <-time.After(2 * waitFor):
			t.Fatalf("statechurn did not say %q in time; stderr %q", want, stderr.String())
		}
	}

	next(fmt.Sprintf("held %d", hold))
	w0, b0 := m.read()
	t0 := time.Now()
	next(fmt.Sprintf("churned %d", cycles))
	took := time.Since(t0)
	w1, b1 := m.read()

	// The state holds the holder's lease, its queued requests and one of
	// the churn's at most, besides what is not a lease.
	stateBound := int64((hold+2)*docLeaseRecord + 1024)
	writeBound := int(took/docQueueSaveDelay) + 2
	t.Logf("%d requests made and closed in %s: %d writes, %d bytes into the state directory (bounds: %d writes, %d bytes)",
		cycles, took.Round(time.Millisecond), w1-w0, b1-b0, writeBound, int64(writeBound)*stateBound)
	if w1-w0 > writeBound {
		t.Errorf("the churn made %d state writes in %s; changes to queued requests alone may make one every %s (%d)",
			w1-w0, took.Round(time.Millisecond), docQueueSaveDelay, writeBound)
	}
	if b1-b0 > int64(writeBound)*stateBound {
		t.Errorf("the churn made mpsd write %d bytes into the state directory in %s; bound %d (%d writes of at most %d bytes)",
			b1-b0, took.Round(time.Millisecond), int64(writeBound)*stateBound, writeBound, stateBound)
	}

	// Every request the member holds is saved (within a second), each
	// with its command cut to the documented length, marked as cut.
	var saved savedState
	waitCond(t, "the state file to hold the member's leases", func() bool {
		saved = savedState{}
		return json.Unmarshal(e.stateBytes(), &saved) == nil && len(saved.Leases) == hold+1
	}, nil)
	for _, l := range saved.Leases {
		if l.UID != stateChurnUID {
			t.Errorf("saved lease %s of uid %d, want the member's %d", l.ID, l.UID, stateChurnUID)
		}
		if n := len(appendJSONStrings(nil, l.Command)); n > docKeptCommand {
			t.Errorf("saved lease %s keeps a command of %d bytes in the state file, more than %d", l.ID, n, docKeptCommand)
		}
		rec, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec) > docLeaseRecord {
			t.Errorf("saved lease %s takes %d bytes in the state file, more than %d", l.ID, len(rec), docLeaseRecord)
		}
	}
	if n := len(e.stateBytes()); n > int(stateBound) {
		t.Errorf("the state takes %d bytes, more than %d", n, stateBound)
	}
	// Status shows the command as kept: cut, and saying so.
	for _, l := range e.d.Status().Leases {
		if l.State != api.LeaseQueued {
			continue
		}
		if last := l.Command[len(l.Command)-1]; !strings.HasSuffix(last, "…") && !strings.HasPrefix(last, "…(+") {
			t.Errorf("status shows queued lease %s's command ending %q, want it marked as cut", l.ID, last)
		}
	}
}
