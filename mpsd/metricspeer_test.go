package mpsd

import (
	"net"
	"net/netip"
	"os"
	"testing"
)

// A loopback TCP peer is known by the uid owning its socket (found in the
// kernel's socket table, IPv4 and IPv6), a peer whose socket is not there
// by its address, a unix peer by its credentials.
func TestMetricsPeerOf(t *testing.T) {
	if got := string(procNetAddr(netip.MustParseAddrPort("127.0.0.1:9486"))); got != "0100007F:250E" {
		t.Errorf("procNetAddr(127.0.0.1:9486) = %q, want 0100007F:250E", got)
	}
	if got := string(procNetAddr(netip.MustParseAddrPort("[::1]:80"))); got != "00000000000000000000000001000000:0050" {
		t.Errorf("procNetAddr([::1]:80) = %q", got)
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		addr := "127.0.0.1:0"
		if network == "tcp6" {
			addr = "[::1]:0"
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Logf("%s: %v (skipped)", network, err)
			continue
		}
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		got := metricsPeerOf(s, peer{}, false)
		if want := (metricsPeer{uid: uint32(os.Getuid()), byUID: true}); got != want {
			t.Errorf("%s loopback peer: %v, want %v", network, got, want)
		}
		_ = c.Close()
		_ = s.Close()
		_ = ln.Close()
	}
	saved := procNetDir
	procNetDir = t.TempDir()
	defer func() { procNetDir = saved }()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := metricsPeerOf(s, peer{}, false), (metricsPeer{addr: netip.MustParseAddr("127.0.0.1")}); got != want {
		t.Errorf("peer not in the socket table: %v, want %v", got, want)
	}
	if got, want := metricsPeerOf(s, peer{uid: 1234}, true), (metricsPeer{uid: 1234, byUID: true}); got != want {
		t.Errorf("unix peer: %v, want %v", got, want)
	}
}
