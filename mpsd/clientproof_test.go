package mpsd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// envProofChild makes the test binary a helper process of the proof's
// tests: it connects to the unix socket the variable names ("-": none),
// says "ok" on stdout and waits for stdin to close.
const envProofChild = "MPSD_TEST_PROOF_CHILD"

func init() {
	addr, ok := os.LookupEnv(envProofChild)
	if !ok {
		return
	}
	if addr != "-" {
		c, err := net.Dial("unix", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer c.Close()
	}
	fmt.Println("ok")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// proofChild starts a helper process connected to addr ("-": to
// nothing), in a network namespace of its own when newNet, and returns
// its pid once it is connected.
func proofChild(t *testing.T, addr string, newNet bool) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envProofChild+"="+addr)
	cmd.Stderr = os.Stderr
	if newNet {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ok\n" {
		t.Fatalf("helper process: %q, %v", line, err)
	}
	return cmd.Process.Pid
}

// acceptAll accepts on l until it is closed, keeping every connection
// open until the test ends.
func acceptAll(t *testing.T, l net.Listener) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
}

func mustOpenPid(t *testing.T, pid int) *pidHandle {
	t.Helper()
	h, err := openPid("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	return h
}

// The proof with real processes and sockets: the test process listens
// (the server) and helper processes connect to it. A process connected
// to the server is proven its client; one connected to nothing, or whose
// only socket is connected to a third process's, is not; nor is a pid
// whose process has gone. A client in another network namespace is
// proven through that namespace's sockets.
func TestProveClient(t *testing.T) {
	if _, err := unixPeers(-1); errors.Is(err, errNoSockDiag) {
		t.Skipf("no unix sock_diag on this kernel: %v", err)
	}
	dir := t.TempDir()
	addr := filepath.Join(dir, "server.sock")
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	acceptAll(t, l)
	server := mustOpenPid(t, os.Getpid())

	connected := mustOpenPid(t, proofChild(t, addr, false))
	waitProven(t, connected, server, true)

	loner := mustOpenPid(t, proofChild(t, "-", false))
	if ok, err := proveClient("/proc", loner, server); ok || err != nil {
		t.Errorf("a process holding no socket: proven %v, %v; want false, nil", ok, err)
	}

	// A process with a connection of its own to the test, taken for the
	// server: the connected client holds sockets and so does it, but
	// none of the one is connected to the other.
	if ok, err := proveClient("/proc", connected, connected); ok || err != nil {
		t.Errorf("the client against itself: proven %v, %v; want false, nil", ok, err)
	}
	other := mustOpenPid(t, proofChild(t, addr, false))
	if ok, err := proveClient("/proc", other, connected); ok || err != nil {
		t.Errorf("a client of the test against another client: proven %v, %v; want false, nil", ok, err)
	}

	// A pid whose process has gone proves nothing.
	gone := exec.Command("true")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	gh, err := openPid("/proc", gone.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.close()
	_ = gone.Wait()
	if ok, err := proveClient("/proc", gh, server); ok || err == nil {
		t.Errorf("a process that exited: proven %v, %v; want false and an error", ok, err)
	}

	t.Run("other network namespace", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root (a network namespace)")
		}
		h := mustOpenPid(t, proofChild(t, addr, true))
		var own, theirs unix.Stat_t
		if unix.Stat("/proc/self/ns/net", &own) != nil || unix.Stat(fmt.Sprintf("/proc/%d/ns/net", h.pid), &theirs) != nil || own.Ino == theirs.Ino {
			t.Fatal("the helper is not in a network namespace of its own")
		}
		waitProven(t, h, server, true)
		if ok, err := proveClient("/proc", h, connected); ok || err != nil {
			t.Errorf("against another process: proven %v, %v; want false, nil", ok, err)
		}
	})
}

// waitProven checks the proof, allowing for the server's accept to
// land: a connection the server has not accepted is in no fd table.
func waitProven(t *testing.T, client, server *pidHandle, want bool) {
	t.Helper()
	var ok bool
	var err error
	for range 200 {
		if ok, err = proveClient("/proc", client, server); ok == want && err == nil {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
	}
	t.Fatalf("pid %d a client of %d: proven %v, %v; want %v", client.pid, server.pid, ok, err, want)
}

// diagMsg builds one netlink message of a sock_diag reply.
func diagMsg(typ uint16, seq uint32, body []byte) []byte {
	ne := binary.NativeEndian
	b := make([]byte, nlAlign(unix.NLMSG_HDRLEN+len(body)))
	ne.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	ne.PutUint16(b[4:], typ)
	ne.PutUint16(b[6:], unix.NLM_F_MULTI)
	ne.PutUint32(b[8:], seq)
	copy(b[unix.NLMSG_HDRLEN:], body)
	return b
}

// diagSock is a unix_diag_msg for inode ino, with a UNIX_DIAG_PEER
// attribute when peer is not 0, and an attribute of another type before
// it (skipped).
func diagSock(ino, peer uint32) []byte {
	ne := binary.NativeEndian
	b := make([]byte, unixDiagMsgLen, unixDiagMsgLen+16)
	b[0] = unix.AF_UNIX
	b[1] = unix.SOCK_STREAM
	b[2] = 1 // TCP_ESTABLISHED
	ne.PutUint32(b[4:], ino)
	// UNIX_DIAG_SHUTDOWN (u8, padded).
	b = append(b, 5, 0, 6, 0, 0, 0, 0, 0)
	if peer != 0 {
		a := make([]byte, 8)
		ne.PutUint16(a[0:], 8)
		ne.PutUint16(a[2:], unixDiagPeer)
		ne.PutUint32(a[4:], peer)
		b = append(b, a...)
	}
	return b
}

func errBody(errno int32) []byte {
	b := make([]byte, 4+unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(b, uint32(errno))
	return b
}

func TestParseUnixDiag(t *testing.T) {
	join := func(ms ...[]byte) []byte {
		var b []byte
		for _, m := range ms {
			b = append(b, m...)
		}
		return b
	}
	peers := map[uint32]uint32{}
	done, err := parseUnixDiag(join(diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, diagSock(10, 11)),
		diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, diagSock(12, 0))), 7, peers)
	if done || err != nil || len(peers) != 1 || peers[10] != 11 {
		t.Fatalf("two sockets: done %v, err %v, peers %v", done, err, peers)
	}
	done, err = parseUnixDiag(join(diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, diagSock(11, 10)), diagMsg(unix.NLMSG_DONE, 7, make([]byte, 4))), 7, peers)
	if !done || err != nil || peers[11] != 10 {
		t.Fatalf("last datagram: done %v, err %v, peers %v", done, err, peers)
	}
	for name, c := range map[string]struct {
		b      []byte
		noDiag bool
	}{
		"no unix_diag":      {b: diagMsg(unix.NLMSG_ERROR, 7, errBody(-int32(unix.ENOENT))), noDiag: true},
		"permission":        {b: diagMsg(unix.NLMSG_ERROR, 7, errBody(-int32(unix.EPERM)))},
		"done with error":   {b: diagMsg(unix.NLMSG_DONE, 7, errBody(-int32(unix.EOPNOTSUPP))), noDiag: true},
		"another sequence":  {b: diagMsg(unix.SOCK_DIAG_BY_FAMILY, 8, diagSock(1, 2))},
		"short header":      {b: make([]byte, 8)},
		"length past end":   {b: diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, diagSock(1, 2))[:20]},
		"short socket":      {b: diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, make([]byte, 8))},
		"another family":    {b: diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, make([]byte, unixDiagMsgLen))},
		"attribute too big": {b: diagMsg(unix.SOCK_DIAG_BY_FAMILY, 7, append(diagSock(1, 0), 0xff, 0, 2, 0))},
	} {
		done, err := parseUnixDiag(c.b, 7, map[uint32]uint32{})
		if err == nil {
			t.Errorf("%s: done %v, no error", name, done)
		} else if errors.Is(err, errNoSockDiag) != c.noDiag {
			t.Errorf("%s: %v; is errNoSockDiag: %v, want %v", name, err, !c.noDiag, c.noDiag)
		}
	}
	req := unixDiagDumpRequest(3)
	if len(req) != 40 || binary.NativeEndian.Uint32(req) != 40 || req[16] != unix.AF_UNIX {
		t.Errorf("request: % x", req)
	}
}

// The kernel's reply is outside input: no datagram makes the parser
// panic or loop, and every peer it records came with a socket message.
func FuzzParseUnixDiag(f *testing.F) {
	f.Add(append(diagMsg(unix.SOCK_DIAG_BY_FAMILY, 1, diagSock(10, 11)), diagMsg(unix.NLMSG_DONE, 1, make([]byte, 4))...))
	f.Add(diagMsg(unix.NLMSG_ERROR, 1, errBody(-int32(unix.ENOENT))))
	f.Add(diagMsg(unix.NLMSG_ERROR, 1, errBody(-1<<31)))
	f.Add(diagMsg(unix.SOCK_DIAG_BY_FAMILY, 1, append(diagSock(1, 0), 4, 0, 2, 0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		peers := map[uint32]uint32{}
		_, err := parseUnixDiag(b, 1, peers)
		for ino, p := range peers {
			if p == 0 {
				t.Errorf("socket %d recorded with peer 0", ino)
			}
		}
		if err == nil && len(b) > 0 && len(b) < unix.NLMSG_HDRLEN {
			t.Errorf("%d bytes parsed without error", len(b))
		}
	})
}

// A process holding more descriptors than a proof reads is not proven
// (its owner could make each proof cost mpsd a million readlinks); one
// within the bound has its sockets read.
func TestSocketInodesBounded(t *testing.T) {
	proc := t.TempDir()
	fd := filepath.Join(proc, "7", "fd")
	if err := os.MkdirAll(fd, 0o755); err != nil {
		t.Fatal(err)
	}
	link := func(i int, target string) {
		if err := os.Symlink(target, filepath.Join(fd, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	link(0, "socket:[42]")
	link(1, "pipe:[43]")
	got, err := socketInodes(proc, 7)
	if err != nil || len(got) != 1 || !got[42] {
		t.Fatalf("socketInodes = %v, %v; want socket 42 only", got, err)
	}
	for i := 2; i <= maxProofFds; i++ {
		link(i, "anon_inode:[eventfd]")
	}
	if got, err := socketInodes(proc, 7); err == nil {
		t.Fatalf("socketInodes of %d descriptors = %v; want an error (more than %d)", maxProofFds+1, got, maxProofFds)
	}
}
