package mpsd

import (
	"context"
	"log/slog"
	"sync"
)

// coreMu is Daemon.mu: a mutex whose holder may leave log lines
// (logAfter) that are written once it lets go, so that formatting and
// writing them (most of a grant's or a release's time under the lock at
// a thousand clients) is not time every other request waits for the core.
// Each holder writes its own lines, in the order it left them; the lines
// of two holders in a row may land in either order.
type coreMu struct {
	sync.Mutex
	after []afterLine // left by the holder; guarded by the mutex itself
}

// afterLine is a line left for after the unlock (Info unless level says).
type afterLine struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	attrs []any
}

// logAfter leaves an Info line on log to be written once the lock is let
// go. The caller holds it.
func (m *coreMu) logAfter(log *slog.Logger, msg string, attrs ...any) {
	m.after = append(m.after, afterLine{log: log, msg: msg, attrs: attrs})
}

// errorAfter is logAfter for an Error line.
func (m *coreMu) errorAfter(log *slog.Logger, msg string, attrs ...any) {
	m.after = append(m.after, afterLine{log: log, level: slog.LevelError, msg: msg, attrs: attrs})
}

// Unlock lets go of the lock, then writes the lines its holder left.
func (m *coreMu) Unlock() {
	lines := m.after
	m.after = nil
	m.Mutex.Unlock()
	for _, l := range lines {
		l.log.Log(context.Background(), l.level, l.msg, l.attrs...)
	}
}
