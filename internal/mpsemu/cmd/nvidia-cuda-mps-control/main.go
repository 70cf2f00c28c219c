// Command nvidia-cuda-mps-control is the MPS emulator's control daemon and
// control client; see internal/mpsemu/control.
package main

import (
	"os"

	"github.com/mpsd/mpsd/internal/mpsemu/control"
)

func main() { os.Exit(control.Main(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)) }
