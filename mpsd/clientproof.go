package mpsd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MPS's client list is what the clients told their server: a client may
// name any pid. Before reconciliation signals a process MPS lists, it
// proves the process is a client of that server: it holds a unix socket
// connected to one the server holds. The kernel says which socket is
// connected to which (sock_diag, UDIAG_SHOW_PEER); /proc/PID/fd says
// which sockets each process holds, read while a pidfd shows the process
// is the one checked.

// errNoSockDiag: the kernel cannot list unix sockets' peers (no
// NETLINK_SOCK_DIAG, or no unix_diag): no process can be proven a client.
var errNoSockDiag = errors.New("the kernel lists no unix socket peers (sock_diag for AF_UNIX unavailable)")

// proveClient reports whether the process client holds a unix socket
// connected to a socket the process server holds. Both handles are
// pidfds opened before the call; what /proc says of either is used only
// if the pidfd shows the process alive (and its start time unchanged)
// after it was read. An error means it could not be told (then the
// process is not proven).
func proveClient(proc string, client, server *pidHandle) (bool, error) {
	mine, err := socketInodes(proc, client.pid)
	if err != nil {
		return false, fmt.Errorf("sockets of pid %d: %w", client.pid, err)
	}
	if len(mine) == 0 {
		return false, nil
	}
	theirs, err := socketInodes(proc, server.pid)
	if err != nil {
		return false, fmt.Errorf("sockets of server %d: %w", server.pid, err)
	}
	if len(theirs) == 0 {
		return false, nil
	}
	// Both ends of a unix connection live in the network namespace of the
	// process that connected: the client's.
	ns, err := os.Open(filepath.Join(proc, strconv.Itoa(client.pid), "ns", "net"))
	if err != nil {
		return false, fmt.Errorf("network namespace of pid %d: %w", client.pid, err)
	}
	defer func() { _ = ns.Close() }()
	for _, h := range []*pidHandle{client, server} {
		if err := h.same(proc); err != nil {
			return false, err
		}
	}
	peers, err := unixPeersIn(int(ns.Fd()))
	if err != nil {
		return false, err
	}
	for ino := range mine {
		if p, ok := peers[ino]; ok && theirs[p] {
			return true, nil
		}
	}
	for ino := range theirs {
		if p, ok := peers[ino]; ok && mine[p] {
			return true, nil
		}
	}
	return false, nil
}

// same fails unless the pidfd's process is alive and pid still names it
// (its start time is the one read when the pidfd was opened).
func (h *pidHandle) same(proc string) error {
	if !h.alive() {
		return fmt.Errorf("pid %d exited", h.pid)
	}
	st, err := procStartTime(proc, h.pid)
	if err != nil {
		return err
	}
	if st != h.start {
		return fmt.Errorf("pid %d names another process now", h.pid)
	}
	return nil
}

// maxProofFds bounds the descriptors of one process a proof reads: a
// tenant's process may hold a million, and each costs mpsd a readlink. A
// process with more is not proven (reported, never signalled).
const maxProofFds = 1 << 16

// socketInodes is the inodes of the sockets process pid holds (its
// /proc/PID/fd links "socket:[N]"), from at most maxProofFds descriptors.
func socketInodes(proc string, pid int) (map[uint32]bool, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid), "fd")
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	ents, err := f.ReadDir(maxProofFds + 1)
	_ = f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(ents) > maxProofFds {
		return nil, fmt.Errorf("more than %d descriptors to check", maxProofFds)
	}
	out := map[uint32]bool{}
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed since
		}
		s, ok := strings.CutPrefix(t, "socket:[")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 32); err == nil {
			out[uint32(n)] = true
		}
	}
	return out, nil
}

// unixPeersIn lists the unix sockets of the network namespace nsFd names
// (an open /proc/PID/ns/net) that have a peer: inode → peer's inode. The
// netlink socket is made in that namespace (sock_diag lists only its
// own), on a thread that enters it and returns; the thread is given back
// to the runtime only once it is back in mpsd's namespace.
func unixPeersIn(nsFd int) (map[uint32]uint32, error) {
	var own, target unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &own); err != nil {
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	if err := unix.Fstat(nsFd, &target); err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	if own.Dev == target.Dev && own.Ino == target.Ino {
		return unixPeers(-1)
	}
	type result struct {
		fd  int
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{-1, fmt.Errorf("own network namespace: %w", err)}
			return
		}
		defer func() { _ = unix.Close(back) }()
		if err := unix.Setns(nsFd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			res <- result{-1, fmt.Errorf("enter the client's network namespace: %w", err)}
			return
		}
		fd, err := diagSocket()
		if serr := unix.Setns(back, unix.CLONE_NEWNET); serr != nil {
			// The thread stays locked: it ends with this goroutine,
			// never to run another in the wrong namespace.
			if fd >= 0 {
				_ = unix.Close(fd)
			}
			res <- result{-1, fmt.Errorf("leave the client's network namespace: %w", serr)}
			return
		}
		runtime.UnlockOSThread()
		res <- result{fd, err}
	}()
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	return unixPeers(r.fd)
}

// diagSocket opens a NETLINK_SOCK_DIAG socket in the calling thread's
// network namespace.
func diagSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return -1, fmt.Errorf("%w: %v", errNoSockDiag, err)
		}
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	return fd, nil
}

// sock_diag's unix request and reply (linux/unix_diag.h); x/sys/unix
// has the netlink constants but not these.
const (
	udiagShowPeer  = 0x4    // UDIAG_SHOW_PEER
	unixDiagPeer   = 2      // UNIX_DIAG_PEER attribute: the peer's inode (u32)
	unixDiagReqLen = 24     // struct unix_diag_req
	unixDiagMsgLen = 16     // struct unix_diag_msg
	nlaTypeMask    = 0x3fff // NLA_TYPE_MASK: an attribute's type without its flags
)

// unixDiagDumpSeq is the sequence number of the dump request.
const unixDiagDumpSeq = 1

// unixPeers dumps every unix socket of fd's namespace with its peer
// (fd: an open NETLINK_SOCK_DIAG socket, closed here; -1: open one in
// the calling thread's namespace).
func unixPeers(fd int) (map[uint32]uint32, error) {
	if fd < 0 {
		var err error
		if fd, err = diagSocket(); err != nil {
			return nil, err
		}
	}
	defer func() { _ = unix.Close(fd) }()
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Sendto(fd, unixDiagDumpRequest(unixDiagDumpSeq), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	peers := map[uint32]uint32{}
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sock_diag reply: %w", err)
		}
		done, err := parseUnixDiag(buf[:n], unixDiagDumpSeq, peers)
		if err != nil {
			return nil, err
		}
		if done {
			return peers, nil
		}
	}
}

// unixDiagDumpRequest is a netlink message asking for every unix socket
// (every state) with its peer.
func unixDiagDumpRequest(seq uint32) []byte {
	ne := binary.NativeEndian
	b := make([]byte, unix.NLMSG_HDRLEN+unixDiagReqLen)
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[unix.NLMSG_HDRLEN:]
	r[0] = unix.AF_UNIX             // sdiag_family
	ne.PutUint32(r[4:], ^uint32(0)) // udiag_states: all
	ne.PutUint32(r[12:], udiagShowPeer)
	return b
}

// parseUnixDiag reads one datagram of a sock_diag dump reply into peers
// (a socket's inode → its peer's, for sockets that have one). done: the
// dump's end (NLMSG_DONE) was in it. A reply of the kernel's that says
// unix sockets cannot be listed is errNoSockDiag; a malformed one, or an
// answer to another request, an error.
func parseUnixDiag(b []byte, seq uint32, peers map[uint32]uint32) (done bool, err error) {
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			return false, fmt.Errorf("sock_diag reply: %d bytes left, short of a header", len(b))
		}
		l := int(ne.Uint32(b[0:]))
		typ := ne.Uint16(b[4:])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return false, fmt.Errorf("sock_diag reply: message length %d of %d bytes", l, len(b))
		}
		if s := ne.Uint32(b[8:]); s != seq {
			return false, fmt.Errorf("sock_diag reply: sequence %d, want %d", s, seq)
		}
		body := b[unix.NLMSG_HDRLEN:l]
		switch typ {
		case unix.NLMSG_DONE:
			if len(body) >= 4 {
				if e := int32(ne.Uint32(body)); e < 0 {
					return true, diagErrno(unix.Errno(-e))
				}
			}
			return true, nil
		case unix.NLMSG_ERROR:
			if len(body) < 4 {
				return false, errors.New("sock_diag reply: short error message")
			}
			e := int32(ne.Uint32(body))
			if e == 0 {
				break // an acknowledgement
			}
			if e > 0 || e == -e {
				return false, fmt.Errorf("sock_diag reply: error %d", e)
			}
			return false, diagErrno(unix.Errno(-e))
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(body) < unixDiagMsgLen {
				return false, fmt.Errorf("sock_diag reply: socket message of %d bytes", len(body))
			}
			if body[0] != unix.AF_UNIX {
				return false, fmt.Errorf("sock_diag reply: family %d", body[0])
			}
			ino := ne.Uint32(body[4:])
			for a := body[unixDiagMsgLen:]; len(a) > 0; {
				if len(a) < unix.SizeofRtAttr {
					return false, errors.New("sock_diag reply: short attribute")
				}
				al := int(ne.Uint16(a[0:]))
				at := ne.Uint16(a[2:]) & nlaTypeMask
				if al < unix.SizeofRtAttr || al > len(a) {
					return false, fmt.Errorf("sock_diag reply: attribute length %d of %d bytes", al, len(a))
				}
				if at == unixDiagPeer && al >= unix.SizeofRtAttr+4 {
					if p := ne.Uint32(a[unix.SizeofRtAttr:]); p != 0 {
						peers[ino] = p
					}
				}
				a = a[min(nlAlign(al), len(a)):]
			}
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return false, nil
}

// nlAlign rounds n up to netlink's 4-byte alignment.
func nlAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// diagErrno: ENOENT (no unix_diag handler) or EOPNOTSUPP mean the kernel
// cannot list unix sockets.
func diagErrno(e unix.Errno) error {
	if e == unix.ENOENT || e == unix.EOPNOTSUPP || e == unix.EPROTONOSUPPORT {
		return fmt.Errorf("%w: %v", errNoSockDiag, e)
	}
	return fmt.Errorf("sock_diag: %w", e)
}
