package mps

import (
	"log/slog"
	"testing"
	"time"
)

// What the queue never delivers is not lost without a trace: the first
// undelivered server.log event's offset is kept for the next reader, and
// barriers behind it are released so nobody waits for ever.
func TestEventQueueLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    []Event
		deliver   int
		wantUndel int64
	}{
		{"all delivered", []Event{{Kind: ServerFault, InServerLog: true, LogOffset: 10}}, 1, -1},
		{"none delivered", []Event{{Kind: ServerExited}, {Kind: ServerFault, InServerLog: true, LogOffset: 40}, {Kind: ServerFault, InServerLog: true, LogOffset: 90}}, 0, 40},
		{"first of two faults delivered", []Event{{Kind: ServerFault, InServerLog: true, LogOffset: 40}, {Kind: ServerFault, InServerLog: true, LogOffset: 90}}, 1, 90},
		{"control.log events need no offset", []Event{{Kind: ServerStarted}}, 0, -1},
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
			if q.undelivered != tc.wantUndel {
				t.Errorf("undelivered %d, want %d", q.undelivered, tc.wantUndel)
			}
			select {
			case <-ack:
			default:
				t.Error("the undelivered barrier was not released")
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

// An event pushed after the queue stopped, before the handle finished
// closing (a follower's last read), is accounted for like the others; a
// barrier pushed after that is released at once.
func TestEventQueueLatePush(t *testing.T) {
	q := newEventQueue(slog.New(slog.DiscardHandler))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); q.run(stop) }()
	close(stop)
	<-done
	q.push(Event{Kind: ServerFault, InServerLog: true, LogOffset: 77})
	q.finish()
	if q.undelivered != 77 {
		t.Errorf("undelivered %d, want 77", q.undelivered)
	}
	ack := make(chan struct{})
	q.push(Event{Kind: Barrier, ack: &barrierAck{ch: ack}})
	select {
	case <-ack:
	default:
		t.Error("a barrier pushed after finish was not released")
	}
}
