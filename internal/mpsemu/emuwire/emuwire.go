package emuwire

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by Recv when the peer closed the connection.
var ErrClosed = errors.New("emuwire: connection closed")

func prefix(pipeDir string) string {
	abs, err := filepath.Abs(pipeDir)
	if err != nil {
		abs = pipeDir
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return "@mpsemu-" + hex.EncodeToString(sum[:8])
}

// DaemonSocket is the emulated daemon's address for pipeDir.
func DaemonSocket(pipeDir string) string { return prefix(pipeDir) + "-daemon" }

// ServerSocket is the address of the emulated server pid of pipeDir.
func ServerSocket(pipeDir string, pid int) string {
	return prefix(pipeDir) + "-server-" + strconv.Itoa(pid)
}

// AnyServerSocket is where the newest server of pipeDir also listens, for
// clients that have no emulated daemon to ask (NVIDIA's daemon runs).
func AnyServerSocket(pipeDir string) string { return prefix(pipeDir) + "-server" }

// Operations.
const (
	OpServerHello = "server_hello" // server → daemon: I am up (pid)
	OpConfig      = "config"       // daemon → server: defaults to apply
	OpClientHello = "client_hello" // client → daemon or server
	OpReady       = "ready"        // daemon → client: connect to ServerPID
	OpWelcome     = "welcome"      // server → client: accepted, limits
	OpError       = "error"        // any: Err is a CUDA error number
	OpAlloc       = "alloc"        // client → server
	OpOK          = "ok"           // reply
	OpFault       = "fault"        // client → server: fatal fault; server → clients: notification
	OpTerminated  = "terminated"   // server → client: terminate_client
	// OpXid, server → daemon: a client's fault on device UUIDs[0] that
	// the driver would report as Xid Err (the emulated daemon passes it to
	// the simulated GPUs, see MPSEMU_XID_SOCKET).
	OpXid = "xid"
	// OpProcs, server → daemon: the server's clients on device UUIDs[0]
	// (PIDs) and the bytes each has allocated there (Mem, by the same
	// index), sent whenever they change: what NVML reports of the
	// device's processes (the emulated daemon passes it to the simulated
	// GPUs, see MPSEMU_XID_SOCKET).
	OpProcs = "procs"
	// Daemon → server requests, answered with OpOK or OpError.
	OpStatus     = "status"
	OpClients    = "clients"
	OpGetSM      = "get_sm"
	OpSetSM      = "set_sm"
	OpGetPinned  = "get_pinned"
	OpSetPinned  = "set_pinned"
	OpTerminate  = "terminate"
	OpShutdown   = "shutdown"
	OpDeviceList = "device_clients"
)

// Msg is every message; fields unused by an operation stay empty.
type Msg struct {
	Op        string   `json:"op"`
	ID        uint64   `json:"id,omitempty"`
	PID       int      `json:"pid,omitempty"`
	ServerPID int      `json:"server_pid,omitempty"`
	Err       int      `json:"err,omitempty"`
	Text      string   `json:"text,omitempty"`
	SM        float64  `json:"sm,omitempty"`
	Dev       int      `json:"dev,omitempty"`
	Bytes     uint64   `json:"bytes,omitempty"`
	Pinned    []uint64 `json:"pinned,omitempty"` // per device, 0 = no limit
	Mem       []uint64 `json:"mem,omitempty"`    // per device, bytes the client may use
	UUIDs     []string `json:"uuids,omitempty"`
	PIDs      []int    `json:"pids,omitempty"`
	Priority  int      `json:"priority,omitempty"`
	EnvSM     string   `json:"env_sm,omitempty"`     // client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
	EnvPinned string   `json:"env_pinned,omitempty"` // client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
	// EnvVisible is the client's CUDA_VISIBLE_DEVICES; HasVisible says it
	// is set (an empty value selects no device, an unset one all).
	EnvVisible string `json:"env_visible,omitempty"`
	HasVisible bool   `json:"has_visible,omitempty"`
	Multiuser  bool   `json:"multiuser,omitempty"`
}

// Conn carries Msgs over a stream socket. Send is safe for concurrent use;
// Recv must be called from one goroutine.
type Conn struct {
	c   *net.UnixConn
	r   *bufio.Reader
	wmu sync.Mutex
}

// NewConn wraps c.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c, r: bufio.NewReader(c)} }

// Dial connects to an abstract address.
func Dial(addr string) (*Conn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("emuwire: dial %s: %w", addr, err)
	}
	return NewConn(c), nil
}

// Listen listens on an abstract address.
func Listen(addr string) (*net.UnixListener, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("emuwire: listen %s: %w", addr, err)
	}
	return l, nil
}

// Send writes one message.
func (c *Conn) Send(m Msg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("emuwire: encode %s: %w", m.Op, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("emuwire: send %s: %w", m.Op, err)
	}
	return nil
}

// Recv reads one message; ErrClosed at end of stream.
func (c *Conn) Recv() (Msg, error) {
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		if len(line) == 0 {
			return Msg{}, fmt.Errorf("%w: %v", ErrClosed, err)
		}
		return Msg{}, fmt.Errorf("emuwire: read: %w", err)
	}
	var m Msg
	if err := json.Unmarshal(line, &m); err != nil {
		return Msg{}, fmt.Errorf("emuwire: decode %q: %w", line, err)
	}
	return m, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// PeerUID returns the uid of the process at the other end, from the kernel
// (SO_PEERCRED), not from anything the peer claims.
func (c *Conn) PeerUID() (uint32, error) {
	cred, err := c.peer()
	if err != nil {
		return 0, err
	}
	return cred.Uid, nil
}

// PeerPID returns the pid of the process at the other end (SO_PEERCRED).
func (c *Conn) PeerPID() (int, error) {
	cred, err := c.peer()
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

func (c *Conn) peer() (*unix.Ucred, error) {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("emuwire: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("emuwire: peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("emuwire: peer credentials: %w", cerr)
	}
	return cred, nil
}
