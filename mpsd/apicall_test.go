package mpsd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// envAPICall makes the test binary the API caller of the isolation tests
// (apiCallMain): they run it as another uid to speak to mpsd as that user.
const envAPICall = "MPSD_TEST_APICALL"

// apiCallMain sends one request to mpsd's socket through package client,
// as whichever uid runs it, and prints "ok" or the api error code on the
// first line, then the answer's body (of a lease stream, its first event)
// or the error's message.
//
//	-socket S [-method GET|POST] -path P [-body JSON] [-child [-child-state zombie|reaped]]
//
// With -child it first starts /bin/sleep as its own child and replaces
// {child} in the body with that pid (printed on stderr as "child PID"),
// so the request can name a pid the caller is entitled to. After the
// answer it prints "cgroup PATH" on stderr, the child's cgroup v2 path
// then, and kills the child before it exits. -child-state zombie makes
// the child one that has exited but is not reaped yet when the request is
// sent; -child-state reaped one that is gone.
func apiCallMain(args []string) int {
	fs := flag.NewFlagSet("apicall", flag.ContinueOnError)
	socket := fs.String("socket", "", "mpsd's socket")
	method := fs.String("method", "POST", "GET or POST")
	path := fs.String("path", "", "request path, e.g. /v1/drain")
	body := fs.String("body", "", "JSON body")
	child := fs.Bool("child", false, "start a child and substitute its pid for {child} in the body")
	childState := fs.String("child-state", "", "with -child: zombie or reaped instead of running")
	if err := fs.Parse(args); err != nil || *socket == "" || *path == "" {
		fmt.Fprintln(os.Stderr, "apicall: -socket and -path are required")
		return 2
	}
	if *child {
		prog := "/bin/sleep"
		if *childState != "" {
			prog = "/bin/true"
		}
		cmd := exec.Command(prog, "60")
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "apicall:", err)
			return 1
		}
		pid := cmd.Process.Pid
		switch *childState {
		case "zombie":
			if !apiCallWaitZombie(pid) {
				fmt.Fprintln(os.Stderr, "apicall: child did not exit")
				return 1
			}
		case "reaped":
			_ = cmd.Wait()
		}
		defer func() {
			fmt.Fprintf(os.Stderr, "cgroup %s\n", apiCallCgroupOf(pid))
			if *childState != "reaped" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}()
		fmt.Fprintf(os.Stderr, "child %d\n", pid)
		*body = strings.ReplaceAll(*body, "{child}", strconv.Itoa(pid))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.New(*socket)
	var (
		out []byte
		err error
	)
	switch {
	case *method == "GET":
		out, err = c.Get(ctx, *path, nil)
	case *path == api.PathLeases:
		// A lease stream lasts as long as the lease: its first event only.
		var req api.LeaseRequest
		if !strings.HasPrefix(strings.TrimSpace(*body), "{") || json.Unmarshal([]byte(*body), &req) != nil {
			// Not a request this client would send: sent as it is.
			out, err = c.Post(ctx, *path, json.RawMessage(*body), nil)
			break
		}
		var st *client.Stream
		if st, err = c.Lease(ctx, req); err == nil {
			var ev api.Event
			ev, err = st.Next()
			_ = st.Close()
			out, _ = json.Marshal(ev)
		}
	default:
		out, err = c.Post(ctx, *path, json.RawMessage(*body), nil)
	}
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		fmt.Printf("%s\n%s", ae.Code, ae.Message)
	case err != nil:
		fmt.Fprintln(os.Stderr, "apicall:", err)
		return 1
	default:
		fmt.Printf("ok\n%s", out)
	}
	return 0
}

// apiCallWaitZombie waits until pid has exited (state Z): it stays a
// zombie until it is waited for.
func apiCallWaitZombie(pid int) bool {
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

// apiCallCgroupOf is pid's cgroup v2 path, or "?" if it cannot be read.
func apiCallCgroupOf(pid int) string {
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

// apiCallCmd is the command that runs helper (apiCallBinary's) as the
// API caller with args.
func apiCallCmd(helper string, args ...string) *exec.Cmd {
	cmd := exec.Command(helper, args...)
	cmd.Env = append(os.Environ(), envAPICall+"=1")
	return cmd
}

// apiCallBinary puts the test binary where the test's uids can run it
// (dir, reachable by them), as the API caller: a hard link if it can,
// else a copy.
func apiCallBinary(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "apicall")
	if err := os.Link(self, out); err == nil {
		return out, os.Chmod(out, 0o755)
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return "", err
	}
	return out, dst.Close()
}
