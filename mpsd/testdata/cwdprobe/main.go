// Command cwdprobe plays a tenant who left a process with its working
// directory in an MPS pipe directory: it changes into -dir, says
// "ready", and for each line read on stdin tries, by names relative to
// that working directory, to connect to the control socket and to open
// the log FIFO for writing (without blocking), printing one line per try:
// "control ok" or "control <errno text>", then "log ok" or "log <errno
// text>", then "done".
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"syscall"
)

func main() {
	dir := flag.String("dir", "", "the pipe directory to stay in")
	flag.Parse()
	if err := os.Chdir(*dir); err != nil {
		fmt.Println("chdir", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		c, err := net.Dial("unix", "control")
		if errors.Is(err, syscall.EPROTOTYPE) {
			c, err = net.Dial("unixpacket", "control")
		}
		if err != nil {
			fmt.Println("control", errText(err))
		} else {
			fmt.Println("control ok")
			_ = c.Close()
		}
		if f, err := os.OpenFile("log", os.O_WRONLY|syscall.O_NONBLOCK, 0); err != nil {
			fmt.Println("log", errText(err))
		} else {
			fmt.Println("log ok")
			_ = f.Close()
		}
		fmt.Println("done")
	}
}

func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
