// Command connflood is a test helper of package mpsd: it plays a local
// user who opens many idle connections to mpsd, as whichever uid runs it.
//
//	connflood (-socket S | -tcp ADDR) -n N
//
// It opens N connections one after the other, sends nothing, and 1.5s
// after the last one sorts them: a connection mpsd answered (and
// closed) is refused, one that stays silent is held. It prints
// "held H refused R", then the first answer's status line and body on
// one line each, then holds the held connections until its stdin ends.
//
//	connflood -socket S -drop-groups -lease BODY
//
// connects, then drops its supplementary groups (it must run as root
// for that), then sends POST /v1/leases with BODY on that connection and
// prints the status line and the first line of the answer's body.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	socket := flag.String("socket", "", "mpsd's API socket")
	tcp := flag.String("tcp", "", "host:port of mpsd's metrics listener")
	n := flag.Int("n", 1, "connections to open")
	dropGroups := flag.Bool("drop-groups", false, "drop the supplementary groups after connecting")
	lease := flag.String("lease", "", "lease request body to send after connecting")
	flag.Parse()
	network, addr := "unix", *socket
	if *tcp != "" {
		network, addr = "tcp", *tcp
	}
	if addr == "" {
		fmt.Fprintln(os.Stderr, "connflood: -socket or -tcp is required")
		os.Exit(2)
	}
	if *lease != "" {
		os.Exit(request(network, addr, *dropGroups, *lease))
	}
	os.Exit(flood(network, addr, *n))
}

func flood(network, addr string, n int) int {
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.Dial(network, addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "connflood: dial %d: %v\n", i, err)
			return 1
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	answers := make([][]byte, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(deadline)
			b, _ := io.ReadAll(io.LimitReader(c, 64<<10))
			answers[i] = b
		}()
	}
	wg.Wait()
	held, refused := 0, 0
	var first []byte
	for i, a := range answers {
		if len(a) == 0 {
			held++
			_ = conns[i].SetReadDeadline(time.Time{})
			continue
		}
		refused++
		_ = conns[i].Close()
		if first == nil {
			first = a
		}
	}
	fmt.Printf("held %d refused %d\n", held, refused)
	status, body := "-", "-"
	if first != nil {
		head, rest, _ := bytes.Cut(first, []byte("\r\n\r\n"))
		status, _, _ = strings.Cut(string(head), "\r\n")
		body = strings.TrimSpace(string(rest))
	}
	fmt.Println(status)
	fmt.Println(body)
	// Hold until the test is done with us.
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.Close()
	}
	return 0
}

func request(network, addr string, dropGroups bool, body string) int {
	c, err := net.Dial(network, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connflood:", err)
		return 1
	}
	defer func() { _ = c.Close() }()
	if dropGroups {
		if err := syscall.Setgroups([]int{}); err != nil {
			fmt.Fprintln(os.Stderr, "connflood: setgroups:", err)
			return 1
		}
		b, _ := os.ReadFile("/proc/self/status")
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "Groups:") {
				fmt.Fprintf(os.Stderr, "after connecting: %s\n", line)
			}
		}
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST /v1/leases HTTP/1.1\r\nHost: mpsd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	r := bufio.NewReader(c)
	status, err := r.ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "connflood: read answer:", err)
		return 1
	}
	chunked := false
	for {
		h, err := r.ReadString('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, "connflood: read headers:", err)
			return 1
		}
		if strings.EqualFold(strings.TrimSpace(h), "Transfer-Encoding: chunked") {
			chunked = true
		}
		if h == "\r\n" {
			break
		}
	}
	if chunked {
		// The chunk size line comes before the first event.
		if _, err := r.ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "connflood: read chunk:", err)
			return 1
		}
	}
	line, _ := r.ReadString('\n')
	fmt.Println(strings.TrimSpace(status))
	fmt.Println(strings.TrimSpace(line))
	return 0
}
