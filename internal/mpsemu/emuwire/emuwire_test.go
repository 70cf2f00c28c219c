package emuwire

import (
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSocketNames(t *testing.T) {
	long := "/" + strings.Repeat("very-long-directory-name/", 20) + "pipe"
	tests := []struct{ name, dir string }{
		{"short", "/tmp/p"},
		{"long", long},
		{"relative", "pipe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{DaemonSocket(tt.dir), ServerSocket(tt.dir, 4194304), AnyServerSocket(tt.dir)} {
				if !strings.HasPrefix(name, "@mpsemu-") || len(name) > 107 {
					t.Errorf("%q: not an abstract name within sun_path", name)
				}
			}
		})
	}
	if DaemonSocket("/tmp/a/../b") != DaemonSocket("/tmp/b") || DaemonSocket("/tmp/a") == DaemonSocket("/tmp/b") {
		t.Error("names must identify the cleaned absolute pipe directory")
	}
}

func TestRoundTripAndPeer(t *testing.T) {
	addr := DaemonSocket(t.TempDir())
	l, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan error, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			got <- err
			return
		}
		s := NewConn(c)
		defer s.Close()
		m, err := s.Recv()
		if err != nil {
			got <- err
			return
		}
		uid, err := s.PeerUID()
		if err == nil && uid != uint32(os.Geteuid()) {
			err = errors.New("wrong peer uid")
		}
		if err == nil {
			m.Op = OpOK
			err = s.Send(m)
		}
		got <- err
	}()
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := Msg{Op: OpAlloc, PID: 7, Dev: 1, Bytes: 1 << 40, Mem: []uint64{1, 2}, UUIDs: []string{"GPU-x"}}
	if err := c.Send(want); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv()
	if err != nil || m.Op != OpOK || m.PID != 7 || m.Bytes != 1<<40 || len(m.Mem) != 2 || m.UUIDs[0] != "GPU-x" {
		t.Fatalf("echo = %+v, %v", m, err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recv(); !errors.Is(err, ErrClosed) {
		t.Errorf("Recv after peer closed = %v; want ErrClosed", err)
	}
	if _, err := Dial(AnyServerSocket(t.TempDir())); err == nil {
		t.Error("dial of an unbound name succeeded")
	}
}
