// Command mpsforge plays a tenant who writes forged records into an MPS
// pipe directory's world-writable log FIFO, for mpsd's trust-boundary
// tests. It uses the record layout NVIDIA's daemon reads
// (internal/mpsemu/mpslog), so the daemon copies each record into
// control.log or server.log with the kind and pid given here.
//
//	mpsforge -fifo PIPE/log -kind control|server -pid N [-repeat N] -msg TEXT [-msg TEXT ...]
//	mpsforge -fifo PIPE/log -poison
//
// With -repeat it writes the records that many times, as fast as the
// daemon reads them (a full FIFO is waited out, not an error). -poison
// writes one record header whose text length is 0xffffffff and no text:
// NVIDIA's logger then waits for 4 GiB of text and swallows every later
// record.
package main

import (
	"encoding/binary"
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
	poison := flag.Bool("poison", false, "write one record header declaring 0xffffffff bytes of text")
	var text msgs
	flag.Var(&text, "msg", "a record's text (repeatable)")
	flag.Parse()
	if *poison {
		b := mpslog.Record{Kind: mpslog.Server, PID: *pid, Time: time.Now()}.Encode()
		binary.LittleEndian.PutUint32(b[40:44], 0xffffffff) // the text length
		fd, err := syscall.Open(*fifo, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err == nil {
			_, err = syscall.Write(fd, b)
			syscall.Close(fd)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "mpsforge:", err)
			os.Exit(1)
		}
		return
	}
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
