package ctlwire

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSession(t *testing.T) {
	dir := t.TempDir()
	l, err := Listen(filepath.Join(dir, ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		uid   uint32
		kind  uint32
		lines []string
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		c, err := l.AcceptUnix()
		if err != nil {
			r.err = err
			return
		}
		conn := NewConn(c)
		defer conn.Close()
		cred, kind, err := conn.Accept()
		if err != nil {
			r.err = err
			return
		}
		r.uid, r.kind = cred.Uid, kind
		for {
			line, end, err := conn.ReadCommand()
			if err != nil {
				r.err = err
				return
			}
			if end {
				r.err = conn.WriteStatus(7)
				return
			}
			r.lines = append(r.lines, line)
			if err := conn.WriteLine("echo " + line); err != nil {
				r.err = err
				return
			}
		}
	}()

	c, err := Dial(dir)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if err := c.Greet(KindUI); err != nil {
		t.Fatalf("Greet: %v", err)
	}
	for _, line := range []string{"get_server_list\n", "  x\r\n", "no newline"} {
		if err := c.WriteCommand(line); err != nil {
			t.Fatal(err)
		}
		kind, payload, err := c.ReadReply()
		if err != nil || kind != ReplyLine || string(payload) != "echo "+line {
			t.Fatalf("reply to %q = %d %q %v", line, kind, payload, err)
		}
	}
	if err := c.WriteEnd(); err != nil {
		t.Fatal(err)
	}
	kind, payload, err := c.ReadReply()
	if err != nil || kind != ReplyStatus || len(payload) != 4 || payload[0] != 7 {
		t.Fatalf("end of session = %d %q %v; want status 7", kind, payload, err)
	}
	r := <-done
	l.Close()
	if r.err != nil {
		t.Fatalf("daemon side: %v", r.err)
	}
	if r.uid != uint32(os.Geteuid()) || r.kind != KindUI || len(r.lines) != 3 {
		t.Errorf("daemon saw uid %d kind %d lines %q", r.uid, r.kind, r.lines)
	}
	// NVIDIA's daemon leaves its socket files behind; so must Listen.
	if _, err := os.Lstat(filepath.Join(dir, ControlSocket)); err != nil {
		t.Errorf("socket file gone after close: %v", err)
	}
}

func TestDialNoDaemon(t *testing.T) {
	dir := t.TempDir()
	if _, err := Dial(dir); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Dial(empty dir) = %v; want ErrNoDaemon", err)
	}
	// A stale socket file from a killed daemon is no daemon either.
	l, err := Listen(filepath.Join(dir, ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Dial(dir); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Dial(stale socket) = %v; want ErrNoDaemon", err)
	}
	// Listen replaces the stale file.
	l, err = Listen(filepath.Join(dir, ControlSocket))
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l.Close()
}
