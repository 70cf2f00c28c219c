// Command apicall is a test helper of package mpsd: it sends one request
// to mpsd's API socket as whichever uid runs it, so a test can speak as a
// user other than root. It prints the HTTP status on the first line and
// the response body after it (of a lease stream, its first line only).
//
//	apicall -socket S [-method POST] -path P [-body JSON] [-child]
//
// With -child it first starts /bin/sleep as its own child and replaces
// {child} in the body with that pid (printed on stderr as "child PID"),
// so the request can name a pid the caller is entitled to. After the
// answer it prints "cgroup PATH" on stderr, the child's cgroup v2 path
// then, and kills the child before it exits. -child-state zombie makes
// the child one that has exited but is not reaped yet when the request is
// sent; -child-state reaped one that is gone.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

func main() {
	socket := flag.String("socket", "", "mpsd's socket")
	method := flag.String("method", http.MethodPost, "HTTP method")
	path := flag.String("path", "", "request path, e.g. /v1/drain")
	body := flag.String("body", "", "JSON body")
	child := flag.Bool("child", false, "start a child and substitute its pid for {child} in the body")
	childState := flag.String("child-state", "", "with -child: zombie or reaped instead of running")
	flag.Parse()
	if *socket == "" || *path == "" {
		fmt.Fprintln(os.Stderr, "apicall: -socket and -path are required")
		os.Exit(2)
	}
	os.Exit(call(*socket, *method, *path, *body, *child, *childState))
}

func call(socket, method, path, body string, child bool, childState string) int {
	if child {
		prog := "/bin/sleep"
		if childState != "" {
			prog = "/bin/true"
		}
		cmd := exec.Command(prog, "60")
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "apicall:", err)
			return 1
		}
		pid := cmd.Process.Pid
		switch childState {
		case "zombie":
			if !waitZombie(pid) {
				fmt.Fprintln(os.Stderr, "apicall: child did not exit")
				return 1
			}
		case "reaped":
			_ = cmd.Wait()
		}
		defer func() {
			fmt.Fprintf(os.Stderr, "cgroup %s\n", cgroupOf(pid))
			if childState != "reaped" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}()
		fmt.Fprintf(os.Stderr, "child %d\n", pid)
		body = strings.ReplaceAll(body, "{child}", strconv.Itoa(pid))
	}
	c := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://mpsd"+path, rd)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicall:", err)
		return 1
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicall:", err)
		return 1
	}
	defer func() { _ = resp.Body.Close() }()
	var rd2 io.Reader = io.LimitReader(resp.Body, 1<<20)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		// A lease stream lasts as long as the lease: print its first
		// event only.
		line, err := bufio.NewReader(rd2).ReadBytes('\n')
		if err != nil && len(line) == 0 {
			fmt.Fprintln(os.Stderr, "apicall:", err)
			return 1
		}
		fmt.Printf("%d\n%s", resp.StatusCode, line)
		return 0
	}
	b, err := io.ReadAll(rd2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicall:", err)
		return 1
	}
	fmt.Printf("%d\n%s", resp.StatusCode, b)
	return 0
}

// waitZombie waits until pid has exited (state Z): it stays a zombie
// until it is waited for.
func waitZombie(pid int) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// cgroupOf is pid's cgroup v2 path, or "?" if it cannot be read.
func cgroupOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	return "?"
}
