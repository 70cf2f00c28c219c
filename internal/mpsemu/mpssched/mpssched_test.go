package mpssched

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// host records what the scheduler asks for, as one line each.
type host struct {
	next   int
	fail   map[int32]bool // uids whose server cannot start
	events []string
}

func (h *host) StartServer(uid int32) *Server {
	if h.fail[uid] {
		h.events = append(h.events, fmt.Sprintf("start %d failed", uid))
		return nil
	}
	h.next++
	h.events = append(h.events, fmt.Sprintf("start %d as %d", h.next, uid))
	return &Server{PID: h.next, UID: uid}
}
func (h *host) AskShutdown(sv *Server) { h.events = append(h.events, fmt.Sprintf("ask %d", sv.PID)) }
func (h *host) HandOver(c *Client, sv *Server) {
	h.events = append(h.events, fmt.Sprintf("hand %d to %d", c.PID, sv.PID))
}
func (h *host) Refuse(c *Client) { h.events = append(h.events, fmt.Sprintf("refuse %d", c.PID)) }

func (h *host) take() string {
	s := strings.Join(h.events, "; ")
	h.events = nil
	return s
}

func expect(t *testing.T, h *host, want string) {
	t.Helper()
	if got := h.take(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// A uid switch: bob's client waits while alice's server has a client; the
// server is asked to exit, and once it has, bob's starts and takes him.
func TestUIDSwitch(t *testing.T) {
	h := &host{}
	s := New(h, false, 0)
	if _, now := s.Request(10, 1000, nil); now {
		t.Fatal("served before any server ran")
	}
	expect(t, h, "start 1 as 1000")
	alice := s.Servers()[0]
	s.Ready(alice)
	expect(t, h, "hand 10 to 1")
	if _, now := s.Request(11, 1000, nil); !now {
		t.Fatal("alice's second client waited")
	}
	expect(t, h, "hand 11 to 1")
	c, now := s.Request(20, 1001, nil)
	if now || c.Done {
		t.Fatal("bob was served while alice's server runs")
	}
	expect(t, h, "ask 1")
	if !alice.Stopping || s.ServesAtOnce(1000) != nil {
		t.Fatal("a stopping server still takes clients")
	}
	// Alice's next client waits for a server of her uid, behind bob's.
	s.Request(12, 1000, nil)
	expect(t, h, "")
	if got := s.PendingUIDs(); !slices.Equal(got, []int32{1001, 1000}) {
		t.Fatalf("pending %v", got)
	}
	if s.Exited(alice) {
		t.Fatal("the daemon ended without quit")
	}
	expect(t, h, "start 2 as 1001")
	s.Ready(s.Servers()[0])
	expect(t, h, "hand 20 to 2")
}

// Under -multiuser-server every uid is served by the shared server at once.
func TestMultiuser(t *testing.T) {
	h := &host{}
	s := New(h, true, 0)
	s.Request(10, 1000, nil)
	expect(t, h, "start 1 as 0")
	s.Ready(s.Servers()[0])
	expect(t, h, "hand 10 to 1")
	for i, uid := range []int32{1001, 1002, 1000} {
		if _, now := s.Request(20+i, uid, nil); !now {
			t.Fatalf("uid %d waited on a multiuser daemon", uid)
		}
	}
	expect(t, h, "hand 20 to 1; hand 21 to 1; hand 22 to 1")
}

// A server that exits before it is ready hands its waiting clients to the
// next server of their uid; one that cannot start leaves them waiting.
func TestExitBeforeReady(t *testing.T) {
	h := &host{fail: map[int32]bool{}}
	s := New(h, false, 0)
	s.Request(10, 1000, nil)
	gone, _ := s.Request(11, 1000, nil)
	expect(t, h, "start 1 as 1000")
	gone.Done = true // it gave up
	s.Exited(s.Servers()[0])
	expect(t, h, "start 2 as 1000")
	s.Ready(s.Servers()[0])
	expect(t, h, "hand 10 to 2")

	h.fail[1001] = true
	s.Request(20, 1001, nil)
	expect(t, h, "ask 2")
	s.Exited(s.Servers()[0])
	expect(t, h, "start 1001 failed")
	if len(s.Servers()) != 0 || len(s.PendingUIDs()) != 0 {
		t.Fatalf("servers %v, pending %v after a failed start", s.Servers(), s.PendingUIDs())
	}
}

// quit refuses every waiting client, asks the ready servers to exit and
// ends the daemon with its last server.
func TestQuit(t *testing.T) {
	h := &host{}
	s := New(h, false, 0)
	s.Request(10, 1000, nil)
	s.Ready(s.Servers()[0])
	s.Request(20, 1001, nil)
	s.Request(30, 1002, nil)
	expect(t, h, "start 1 as 1000; hand 10 to 1; ask 1")
	dropped, none := s.Quit()
	if dropped != 2 || none {
		t.Fatalf("quit dropped %d, none %v; want 2 queued starts and a server left", dropped, none)
	}
	expect(t, h, "refuse 20; refuse 30")
	if _, now := s.Request(40, 1000, nil); now {
		t.Fatal("served after quit")
	}
	expect(t, h, "refuse 40")
	s.StartServer(1003)
	if !s.Exited(s.Servers()[0]) {
		t.Fatal("the daemon did not end with its last server")
	}
	expect(t, h, "")
}

// start_server -uid queues one start per uid, and none for a running one.
func TestStartServer(t *testing.T) {
	h := &host{}
	s := New(h, false, 0)
	s.StartServer(1000)
	s.StartServer(1000)
	s.StartServer(1001)
	s.StartServer(1001)
	expect(t, h, "start 1 as 1000")
	if got := s.PendingUIDs(); !slices.Equal(got, []int32{1001}) {
		t.Fatalf("pending %v", got)
	}
}

func TestExitsWhenIdle(t *testing.T) {
	if ExitsWhenIdle(false, 0) || ExitsWhenIdle(true, 1) || !ExitsWhenIdle(true, 0) {
		t.Fatal("a server exits only when asked and idle")
	}
}
