package ctlwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Socket names in the pipe directory.
const (
	ControlSocket    = "control"
	PrivilegedSocket = "control_privileged"
)

// KindUI is the connection kind of nvidia-cuda-mps-control's client mode.
const KindUI = 4

// Reply kinds sent by the daemon.
const (
	ReplyLine   = 0
	ReplyStatus = 1
)

var (
	hello = []byte("OUTBHELL\x00")
	creds = []byte("OUTBCRED\x00")
)

var (
	// ErrNoDaemon means neither control socket accepted a connection.
	ErrNoDaemon = errors.New("ctlwire: no control daemon")
	// ErrNoCredentials means the peer did not send its credentials.
	ErrNoCredentials = errors.New("ctlwire: peer sent no valid credentials")
	// ErrProtocol means a packet did not have the expected shape.
	ErrProtocol = errors.New("ctlwire: protocol error")
)

// Conn is one control connection, either end.
type Conn struct {
	c *net.UnixConn
}

// NewConn wraps an accepted or dialled SOCK_SEQPACKET connection.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c} }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// CloseRead shuts the reading side, waking a blocked reader.
func (c *Conn) CloseRead() error { return c.c.CloseRead() }

// Listen binds a control socket the way the daemon does: any stale socket
// file is removed first, and the file stays after the listener closes (the
// real daemon leaves its sockets in the pipe directory on quit).
func Listen(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ctlwire: remove stale %s: %w", path, err)
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("ctlwire: listen %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	return l, nil
}

func (c *Conn) passCred() error {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	return serr
}

// read returns the next packet and its credentials, if any were attached.
func (c *Conn) read(size int) ([]byte, *unix.Ucred, error) {
	b := make([]byte, size)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := c.c.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, nil, err
	}
	var cred *unix.Ucred
	if oobn > 0 {
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if uc, err := unix.ParseUnixCredentials(&m); err == nil {
					cred = uc
				}
			}
		}
	}
	return b[:n], cred, nil
}

func (c *Conn) write(b []byte, oob []byte) error {
	_, _, err := c.c.WriteMsgUnix(b, oob, nil)
	return err
}

// Accept performs the daemon side of the greeting: it returns the peer's
// credentials and the connection kind it announced.
func (c *Conn) Accept() (unix.Ucred, uint32, error) {
	if err := c.passCred(); err != nil {
		return unix.Ucred{}, 0, fmt.Errorf("ctlwire: SO_PASSCRED: %w", err)
	}
	if err := c.write(hello, nil); err != nil {
		return unix.Ucred{}, 0, fmt.Errorf("ctlwire: send greeting: %w", err)
	}
	b, cred, err := c.read(64)
	if err != nil {
		return unix.Ucred{}, 0, fmt.Errorf("ctlwire: read credentials: %w", err)
	}
	if string(b) != string(creds) || cred == nil {
		return unix.Ucred{}, 0, ErrNoCredentials
	}
	b, _, err = c.read(64)
	if err != nil {
		return *cred, 0, fmt.Errorf("ctlwire: read connection kind: %w", err)
	}
	if len(b) != 4 {
		return *cred, 0, fmt.Errorf("%w: connection kind of %d bytes", ErrProtocol, len(b))
	}
	return *cred, binary.LittleEndian.Uint32(b), nil
}

// ReadCommand reads one command line (without its "\x00", with its "\n" if
// the client sent one). done is true when the client ended its input.
func (c *Conn) ReadCommand() (line string, done bool, err error) {
	b, _, err := c.read(16)
	if err != nil {
		return "", false, err
	}
	if len(b) != 8 {
		return "", false, fmt.Errorf("%w: length of %d bytes", ErrProtocol, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n == 0 {
		return "", true, nil
	}
	if n > 1<<20 {
		return "", false, fmt.Errorf("%w: command of %d bytes", ErrProtocol, n)
	}
	b, _, err = c.read(int(n))
	if err != nil {
		return "", false, err
	}
	if i := indexNUL(b); i >= 0 {
		b = b[:i]
	}
	return string(b), false, nil
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func frame(kind uint32, payload []byte) []byte {
	b := make([]byte, 4, 4+len(payload))
	binary.LittleEndian.PutUint32(b, kind)
	return append(b, payload...)
}

// WriteLine sends one output line (without newline).
func (c *Conn) WriteLine(s string) error { return c.write(frame(ReplyLine, []byte(s)), nil) }

// WriteStatus ends the session with an exit status for the client.
func (c *Conn) WriteStatus(status uint32) error {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], status)
	return c.write(frame(ReplyStatus, b[:]), nil)
}

// Dial connects to the daemon of pipeDir as nvidia-cuda-mps-control does:
// the privileged socket first (root only), then the public one.
func Dial(pipeDir string) (*Conn, error) {
	for _, name := range []string{PrivilegedSocket, ControlSocket} {
		path := filepath.Join(pipeDir, name)
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err == nil {
			return NewConn(c), nil
		}
	}
	return nil, ErrNoDaemon
}

// Greet performs the client side of the greeting and announces kind.
func (c *Conn) Greet(kind uint32) error {
	if err := c.passCred(); err != nil {
		return fmt.Errorf("ctlwire: SO_PASSCRED: %w", err)
	}
	b, _, err := c.read(64)
	if err != nil {
		return fmt.Errorf("ctlwire: read greeting: %w", err)
	}
	if string(b) != string(hello) {
		return fmt.Errorf("%w: greeting %q", ErrProtocol, b)
	}
	cred := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())})
	if err := c.write(creds, cred); err != nil {
		return fmt.Errorf("ctlwire: send credentials: %w", err)
	}
	var k [4]byte
	binary.LittleEndian.PutUint32(k[:], kind)
	if err := c.write(k[:], nil); err != nil {
		return fmt.Errorf("ctlwire: send connection kind: %w", err)
	}
	return nil
}

// WriteCommand sends one line as the client does: its length including a
// terminating NUL, then the line and the NUL.
func (c *Conn) WriteCommand(line string) error {
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(line)+1))
	if err := c.write(l[:], nil); err != nil {
		return err
	}
	return c.write(append([]byte(line), 0), nil)
}

// WriteEnd tells the daemon the client has no more input.
func (c *Conn) WriteEnd() error {
	var l [8]byte
	return c.write(l[:], nil)
}

// ReadReply reads one reply packet: ReplyLine with its text, or
// ReplyStatus with the 4-byte status in payload.
func (c *Conn) ReadReply() (kind uint32, payload []byte, err error) {
	b, _, err := c.read(4 + 4096)
	if err != nil {
		return 0, nil, err
	}
	if len(b) < 4 {
		return 0, nil, fmt.Errorf("%w: reply of %d bytes", ErrProtocol, len(b))
	}
	return binary.LittleEndian.Uint32(b), b[4:], nil
}
