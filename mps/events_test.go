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
