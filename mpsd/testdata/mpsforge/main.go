// Command mpsforge plays a tenant who writes forged records into an MPS
// pipe directory's world-writable log FIFO, for mpsd's trust-boundary
// tests. It uses the record layout NVIDIA's daemon reads
// (internal/mpsemu/mpslog), so the daemon copies each record into
// control.log or server.log with the kind and pid given here.
//
//	mpsforge -fifo PIPE/log -kind control|server -pid N [-repeat N] -msg TEXT [-msg TEXT ...]
//
// With -repeat it writes the records that many times, as fast as the
// daemon reads them (a full FIFO is waited out, not an error).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

type msgs []string

func (m *msgs) String() string     { return fmt.Sprint(*m) }
func (m *msgs) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	fifo := flag.String("fifo", "", "the pipe directory's log FIFO")
	kind := flag.String("kind", "server", "control or server")
	pid := flag.Int("pid", 0, "the pid the record claims")
	repeat := flag.Int("repeat", 1, "how many times to write the records")
	var text msgs
	flag.Var(&text, "msg", "a record's text (repeatable)")
	flag.Parse()
	k := mpslog.Server
	if *kind == "control" {
		k = mpslog.Control
	}
	for range *repeat {
		for _, m := range text {
			for {
				err := mpslog.SendFIFO(*fifo, mpslog.Record{Kind: k, PID: *pid, Time: time.Now(), Msg: m})
				if errors.Is(err, syscall.EAGAIN) {
					time.Sleep(time.Millisecond) // the FIFO is full
					continue
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "mpsforge:", err)
					os.Exit(1)
				}
				break
			}
		}
	}
}
