package control

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/ctlwire"
)

// Messages of the client mode, on stderr, as NVIDIA's client prints them.
const (
	msgNoDaemon   = "Cannot find MPS control daemon process\n"
	msgNoAuth     = "Cannot authenticate or connect to MPS control daemon process\n"
	msgCannotSend = "Cannot send command to MPS control daemon process\n"
)

// runClient is nvidia-cuda-mps-control without -d/-f: send each stdin line
// to the daemon, print what it answers, exit with the status the daemon
// sends at the end (0 unless a quit reports a failed server).
//
// Like NVIDIA's client, which prints through stdio, the output is written
// when the program exits: a client killed while the daemon keeps it waiting
// prints nothing.
func runClient(pipeDir string, stdin io.Reader, stdout, stderr io.Writer) int {
	conn, err := ctlwire.Dial(pipeDir)
	if err != nil {
		io.WriteString(stderr, msgNoDaemon)
		return 1
	}
	defer conn.Close()
	if err := conn.Greet(ctlwire.KindUI); err != nil {
		io.WriteString(stderr, msgNoAuth)
		return 1
	}

	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	flush := func() {
		mu.Lock()
		defer mu.Unlock()
		_, _ = stdout.Write(out.Bytes())
		out.Reset()
	}
	result := make(chan int, 1)
	go func() {
		for {
			kind, payload, err := conn.ReadReply()
			switch {
			case errors.Is(err, syscall.ECONNRESET):
				// The daemon exited with our end-of-input unread.
				result <- 0
				return
			case err != nil:
				result <- 1
				return
			case kind == ctlwire.ReplyStatus && len(payload) >= 4:
				result <- int(int32(uint32(payload[0]) | uint32(payload[1])<<8 | uint32(payload[2])<<16 | uint32(payload[3])<<24))
				return
			case kind == ctlwire.ReplyLine:
				mu.Lock()
				out.Write(payload)
				out.WriteByte('\n')
				mu.Unlock()
			}
		}
	}()

	sendFailed := make(chan struct{})
	go func() {
		br := bufio.NewReader(stdin)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				if conn.WriteCommand(line) != nil {
					close(sendFailed)
					return
				}
			}
			if err != nil {
				if conn.WriteEnd() != nil {
					close(sendFailed)
				}
				return
			}
		}
	}()

	var status int
	select {
	case status = <-result:
	case <-sendFailed:
		// The reader usually learns why at once (the daemon is gone, or
		// answered and closed); only a connection that stays silent gets
		// the message. A second, not a tenth: on a loaded machine the
		// reader of a daemon that answered was once later than that, and
		// the answer was taken for a failure.
		select {
		case status = <-result:
		case <-time.After(time.Second):
			flush()
			io.WriteString(stderr, msgCannotSend)
			return 1
		}
	}
	flush()
	return status
}
