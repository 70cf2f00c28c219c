package mps

import (
	"log/slog"
	"testing"
	"time"
)

// A barrier the queue never delivers (the handle closed first) is
// released, so nobody waits on it for ever; so is one pushed after the
// queue finished.
func TestEventQueueReleasesBarriers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		events  []Event
		deliver int
	}{
		{"the barrier in flight", []Event{{Kind: ServerFault, InServerLog: true, LogOffset: 10}}, 1},
		{"the barrier still queued", []Event{{Kind: ServerExited}, {Kind: ServerFault}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newEventQueue(slog.New(slog.DiscardHandler))
			ack := make(chan struct{})
			for _, ev := range tc.events {
				q.push(ev)
			}
			q.push(Event{Kind: Barrier, ack: &barrierAck{ch: ack}})
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() { defer close(done); q.run(stop) }()
			for i := range tc.deliver {
				select {
				case ev := <-q.out:
					if ev.Kind != tc.events[i].Kind {
						t.Fatalf("event %d: %v, want %v", i, ev.Kind, tc.events[i].Kind)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no event within 10s")
				}
			}
			close(stop)
			<-done
			q.finish()
			select {
			case <-ack:
			default:
				t.Error("the undelivered barrier was not released")
			}
			late := make(chan struct{})
			q.push(Event{Kind: Barrier, ack: &barrierAck{ch: late}})
			select {
			case <-late:
			default:
				t.Error("a barrier pushed after finish was not released")
			}
		})
	}
}

// Ack releases a barrier once, however often it is called, and is a no-op
// on other events.
func TestBarrierAck(t *testing.T) {
	ack := make(chan struct{})
	ev := Event{Kind: Barrier, ack: &barrierAck{ch: ack}}
	ev.Ack()
	ev.Ack()
	select {
	case <-ack:
	default:
		t.Fatal("Ack did not release the barrier")
	}
	Event{Kind: ServerFault}.Ack()
}

// A flood of log-line events (anyone may write the records) while the
// reader lags drops only such events, the oldest first: a verified
// server's start and its exit from the pidfd, queued before and in the
// middle of the flood, both reach the reader, in the order they came.
func TestEventQueueNeverDropsFacts(t *testing.T) {
	q := newEventQueue(slog.New(slog.DiscardHandler))
	q.push(Event{Kind: ServerStarted, PID: 1, Source: SourcePidfd})
	const flood = 2 * maxQueuedEvents
	for i := range flood {
		if i == flood/2 {
			q.push(Event{Kind: ServerExited, PID: 1, Source: SourcePidfd})
		}
		q.push(Event{Kind: ServerReady, PID: 1000 + i, Source: SourceLog})
	}
	q.push(Event{Kind: DaemonExited, PID: 2, Source: SourcePidfd})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); q.run(stop) }()
	var got []Event
	timeout := time.After(10 * time.Second)
	for len(got) == 0 || got[len(got)-1].Kind != DaemonExited {
		select {
		case ev := <-q.out:
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("the daemon's exit not delivered within 10s (%d events)", len(got))
		}
	}
	close(stop)
	<-done
	q.finish()
	var hints int
	lastClient, exitAt := 0, -1
	for i, ev := range got {
		switch ev.Kind {
		case ServerReady:
			hints++
			if ev.PID <= lastClient {
				t.Fatalf("client %d delivered after client %d", ev.PID, lastClient)
			}
			lastClient = ev.PID
		case ServerExited:
			exitAt = i
			if lastClient >= 1000+flood/2 {
				t.Errorf("the server's exit came after client %d, pushed after it", lastClient)
			}
		}
	}
	if got[0].Kind != ServerStarted {
		t.Errorf("first event %v, want the server's start", got[0].Kind)
	}
	if exitAt < 0 {
		t.Error("the server's exit was dropped")
	}
	if hints != maxQueuedEvents {
		t.Errorf("%d log-line events delivered, want the newest %d", hints, maxQueuedEvents)
	}
	if lastClient != 1000+flood-1 {
		t.Errorf("last client delivered %d, want the newest, %d", lastClient, 1000+flood-1)
	}
}

// Records anyone may write (NEW CLIENT, fatal exception, start failure;
// ready records naming a server, per server) wait one of each key at a
// time: a flood of them neither fills the hints' bound nor
// pushes out a record about another verified server, and the reader
// still learns that they came and how many (Suppressed).
func TestEventQueueCoalescesUncheckedRecords(t *testing.T) {
	q := newEventQueue(slog.New(slog.DiscardHandler))
	const flood = 2 * maxQueuedEvents
	for i := range flood {
		if i == maxQueuedEvents {
			q.push(Event{Kind: ServerFault, PID: 7, KnownServer: true, Source: SourceLog})
		}
		q.push(Event{Kind: ClientConnected, PID: 1000 + i, Source: SourceLog})
		q.push(Event{Kind: FatalException, PID: 7, Source: SourceLog})
		// Records a member may write naming its own server (its pid is
		// in /proc), and start failures, which name none.
		q.push(Event{Kind: ServerReady, PID: 8, Source: SourceLog})
		q.push(Event{Kind: ServerStartFailed, Source: SourceLog, Suppressed: 1})
	}
	q.push(Event{Kind: DaemonExited, PID: 2, Source: SourcePidfd})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); q.run(stop) }()
	n := map[EventKind]int{}
	stands := map[coalesceKey]int{} // the records each key's events stand for
	timeout := time.After(10 * time.Second)
	for n[DaemonExited] == 0 {
		select {
		case ev := <-q.out:
			n[ev.Kind]++
			key, _ := ev.coalesceKey()
			stands[key] += 1 + ev.Suppressed
		case <-timeout:
			t.Fatalf("the daemon's exit not delivered within 10s (%v)", n)
		}
	}
	close(stop)
	<-done
	q.finish()
	if n[ServerFault] != 1 || n[ClientConnected] != 1 || n[FatalException] != 1 || n[ServerReady] != 1 || n[ServerStartFailed] != 1 {
		t.Errorf("delivered %v; want the fault record of server 7, and one each of the flood's kinds", n)
	}
	// Each delivered hint counts what it stands for: nothing is lost
	// from the counts, only the events.
	for key, want := range map[coalesceKey]int{
		{ServerReady, 8}:          flood,
		{kind: ServerStartFailed}: 2 * flood, {kind: ClientConnected}: flood, {kind: FatalException}: flood,
	} {
		if got := stands[key]; got != want {
			t.Errorf("%s of pid %d: delivered events stand for %d records, want %d", key.kind, key.pid, got, want)
		}
	}
	// Once the reader has taken it, the next of a kind waits again.
	q2 := newEventQueue(slog.New(slog.DiscardHandler))
	q2.push(Event{Kind: ClientConnected, PID: 1})
	q2.mu.Lock()
	e, _ := q2.popLocked()
	q2.mu.Unlock()
	q2.push(Event{Kind: ClientConnected, PID: 2})
	q2.mu.Lock()
	e2, ok := q2.popLocked()
	q2.mu.Unlock()
	if e.ev.PID != 1 || !ok || e2.ev.PID != 2 {
		t.Errorf("after the first was taken: %v, %v %v; want client 2 queued", e.ev, e2.ev, ok)
	}
}
