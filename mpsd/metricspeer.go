package mpsd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
)

// metricsPeer is whom the metrics listener counts a connection against
// for limits.metrics_connections_per_user: a uid where it is known (a
// unix socket's peer credentials; the owner of a loopback TCP peer's
// socket, from the kernel's socket table), else the remote address.
type metricsPeer struct {
	uid   uint32
	byUID bool
	addr  netip.Addr
}

func (m metricsPeer) String() string {
	if m.byUID {
		return "uid " + strconv.FormatUint(uint64(m.uid), 10)
	}
	return "address " + m.addr.String()
}

// procNetDir is where the kernel's socket tables are read (a variable for
// tests).
var procNetDir = "/proc/self/net"

// metricsPeerOf says whom c counts against. A TCP peer on this host
// (loopback) is known by the uid that owns its socket: the row of the
// socket table whose local address is c's remote one and whose remote
// address is c's local one. A peer gone before the lookup, or one on
// another host, is known by its address.
func metricsPeerOf(c net.Conn, p peer, hasPeer bool) metricsPeer {
	if hasPeer {
		return metricsPeer{uid: p.uid, byUID: true}
	}
	ra, ok1 := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return metricsPeer{}
	}
	remote, local := ra.AddrPort(), la.AddrPort()
	m := metricsPeer{addr: remote.Addr().Unmap()}
	if !m.addr.IsLoopback() {
		return m
	}
	if uid, ok := tcpSocketOwner(remote, local); ok {
		return metricsPeer{uid: uid, byUID: true}
	}
	return m
}

// tcpSocketOwner finds the uid owning the TCP socket from local to remote
// in the kernel's tables (/proc/net/tcp and tcp6).
func tcpSocketOwner(local, remote netip.AddrPort) (uint32, bool) {
	if local.Addr().Unmap().Is4() && remote.Addr().Unmap().Is4() {
		l4 := netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
		r4 := netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
		if uid, ok := scanTCPTable(procNetDir+"/tcp", procNetAddr(l4), procNetAddr(r4)); ok {
			return uid, true
		}
		// An AF_INET6 socket talking to an IPv4 address.
		l6 := netip.AddrPortFrom(netip.AddrFrom16(l4.Addr().As16()), l4.Port())
		r6 := netip.AddrPortFrom(netip.AddrFrom16(r4.Addr().As16()), r4.Port())
		return scanTCPTable(procNetDir+"/tcp6", procNetAddr(l6), procNetAddr(r6))
	}
	return scanTCPTable(procNetDir+"/tcp6", procNetAddr(local), procNetAddr(remote))
}

// procNetAddr writes ap as /proc/net/tcp{,6} does: each 32-bit word of
// the address in host byte order, in hex, then the port.
func procNetAddr(ap netip.AddrPort) []byte {
	var b []byte
	if a := ap.Addr(); a.Is4() {
		s := a.As4()
		b = fmt.Appendf(b, "%08X", binary.NativeEndian.Uint32(s[:]))
	} else {
		s := a.As16()
		for i := 0; i < 16; i += 4 {
			b = fmt.Appendf(b, "%08X", binary.NativeEndian.Uint32(s[i:i+4]))
		}
	}
	return fmt.Appendf(b, ":%04X", ap.Port())
}

// scanTCPTable returns the uid column of the row of file whose local and
// remote address columns are local and remote.
func scanTCPTable(file string, local, remote []byte) (uint32, bool) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid ...
		fields := bytes.Fields(s.Bytes())
		if len(fields) < 8 || !bytes.Equal(fields[1], local) || !bytes.Equal(fields[2], remote) {
			continue
		}
		uid, err := strconv.ParseUint(string(fields[7]), 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(uid), true
	}
	return 0, false
}
