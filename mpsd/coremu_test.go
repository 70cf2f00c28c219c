package mpsd

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestCoreMuLogsAfterUnlock: a line left under Daemon.mu is written once
// the lock is let go, not before, in the order it was left, at its level,
// and once.
func TestCoreMuLogsAfterUnlock(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	var mu coreMu
	mu.Lock()
	mu.logAfter(log, "lease granted", "lease", "g-1")
	mu.logAfter(log, "lease released", "lease", "g-1", "why", "done")
	mu.errorAfter(log, "history: ended leases not recorded", "dropped", 2)
	if buf.Len() != 0 {
		t.Fatalf("written under the lock: %q", buf.String())
	}
	mu.Unlock()
	want := "level=INFO msg=\"lease granted\" lease=g-1\nlevel=INFO msg=\"lease released\" lease=g-1 why=done\nlevel=ERROR msg=\"history: ended leases not recorded\" dropped=2\n"
	if buf.String() != want {
		t.Fatalf("after Unlock: %q, want %q", buf.String(), want)
	}
	if !mu.TryLock() {
		t.Fatal("Unlock left the lock held")
	}
	mu.Unlock()
	if n := strings.Count(buf.String(), "\n"); n != 3 {
		t.Fatalf("a second Unlock wrote the lines again: %d lines", n)
	}
}
