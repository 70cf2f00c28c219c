// Command nvidia-cuda-mps-server is the MPS emulator's server; see
// internal/mpsemu/server.
package main

import (
	"os"

	"github.com/mpsd/mpsd/internal/mpsemu/server"
)

func main() { os.Exit(server.Main(os.Getenv, os.Stderr)) }
