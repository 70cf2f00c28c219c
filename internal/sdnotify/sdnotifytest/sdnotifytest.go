// Package sdnotifytest is a NOTIFY_SOCKET for tests: it records what a
// Type=notify service (mpsd, or sdnotify's Notifier alone) tells systemd.
package sdnotifytest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Listener is a NOTIFY_SOCKET owned by the test: it records every
// datagram sent to it, in order.
type Listener struct {
	// Path is the socket: the value of NOTIFY_SOCKET.
	Path string
	conn *net.UnixConn
	done chan struct{}

	mu   sync.Mutex
	msgs []string
}

// New listens on a fresh socket, closed and removed when the test ends.
func New(t *testing.T) *Listener {
	t.Helper()
	// Short: the path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	nl := &Listener{Path: path, conn: conn, done: make(chan struct{})}
	go func() {
		defer close(nl.done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			nl.mu.Lock()
			nl.msgs = append(nl.msgs, string(buf[:n]))
			nl.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-nl.done
		_ = os.RemoveAll(dir)
	})
	return nl
}

// All returns the messages received so far.
func (nl *Listener) All() []string {
	nl.mu.Lock()
	defer nl.mu.Unlock()
	return append([]string(nil), nl.msgs...)
}

// Wait returns the index of the first message at or after from that
// matches, failing the test after within.
func (nl *Listener) Wait(t *testing.T, what string, from int, within time.Duration, match func(string) bool) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msgs := nl.All()
		for i := from; i < len(msgs); i++ {
			if match(msgs[i]) {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s; received %q", what, within, msgs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Count is how many messages at or after from match.
func (nl *Listener) Count(from int, match func(string) bool) int {
	n := 0
	msgs := nl.All()
	for i := from; i < len(msgs); i++ {
		if match(msgs[i]) {
			n++
		}
	}
	return n
}

// Has reports whether a message holds the assignment kv on a line of its
// own (messages are newline-separated assignments).
func Has(kv string) func(string) bool {
	return func(m string) bool {
		for _, l := range strings.Split(m, "\n") {
			if l == kv {
				return true
			}
		}
		return false
	}
}

// HasPrefix reports whether a message has a line that begins with p.
func HasPrefix(p string) func(string) bool {
	return func(m string) bool {
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, p) {
				return true
			}
		}
		return false
	}
}

// ClearEnv keeps the host's own systemd variables (a test run from a
// unit) away from the test.
func ClearEnv(t *testing.T) {
	for _, k := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		t.Setenv(k, "")
		_ = os.Unsetenv(k)
	}
}
