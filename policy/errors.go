package policy

import (
	"errors"
	"strconv"
	"strings"
)

var (
	// ErrInvalidConfig is matched by every error that says a config file is
	// unusable: YAML syntax, unknown keys, bad values, failed checks
	// against the host. errors.As with *ConfigError gives each problem.
	ErrInvalidConfig = errors.New("policy: invalid config")

	// ErrInvalidRequest: a request asks for something its group never
	// allows (sm outside 1-100 or above max_sm, mem above max_mem, a number
	// of GPUs other than an instance's). Refuse it at once.
	ErrInvalidRequest = errors.New("policy: invalid request")
	// ErrNeverFits: a valid request that no instance of its group could
	// hold even if it were empty (no instance, or budgets smaller than
	// the request). Refuse it at once.
	ErrNeverFits = errors.New("policy: request can never fit")
	// ErrNoRoomNow: the request fits an instance of its group in principle
	// but none has room, is ready, or runs a compatible server now. Queue
	// it.
	ErrNoRoomNow = errors.New("policy: no room now")
	// ErrOnlyClosed: the only instances that could ever hold the request
	// are drained or quarantined, closed until an operator reopens them.
	// Queue it, but let the requests behind it pass (see Next).
	ErrOnlyClosed = errors.New("policy: only closed instances could hold it")
	// ErrEmptyQueue: Next was given no request.
	ErrEmptyQueue = errors.New("policy: queue is empty")

	// ErrUnknownGroup: the caller named a group the config does not have.
	ErrUnknownGroup = errors.New("policy: unknown group")
	// ErrNotAllowed: the caller is not a member of the group it named.
	ErrNotAllowed = errors.New("policy: not allowed")
	// ErrNoGroup: the caller named no group and is a member of none.
	ErrNoGroup = errors.New("policy: no group allowed")
	// ErrGroupNeeded: the caller named no group, may use several and has
	// no default group (default_for).
	ErrGroupNeeded = errors.New("policy: group needed")

	// ErrWatchStopped: the config's directory went away, so the Watcher
	// can no longer see edits.
	ErrWatchStopped = errors.New("policy: config watch stopped")
)

// Problem is one thing wrong with a config, at a key path such as
// "groups.inference.memory" or "groups.inference.users[1]". Key is empty
// for problems with the file as a whole (YAML syntax, size).
type Problem struct {
	Key     string
	Message string
}

func (p Problem) String() string {
	if p.Key == "" {
		return p.Message
	}
	return p.Key + ": " + p.Message
}

// ConfigError lists every problem found in a config, sorted by key path.
// It matches ErrInvalidConfig.
type ConfigError struct {
	// Path is the file, when the config was read from one.
	Path     string
	Problems []Problem
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("policy: invalid config")
	if e.Path != "" {
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	if len(e.Problems) == 1 {
		b.WriteString(e.Problems[0].String())
		return b.String()
	}
	b.WriteString(strconv.Itoa(len(e.Problems)))
	b.WriteString(" problems")
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }
