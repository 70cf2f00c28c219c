// Command mpsemu-client is the MPS emulator's stand-in CUDA application; see
// internal/mpsemu/client.
package main

import (
	"os"

	"github.com/mpsd/mpsd/internal/mpsemu/client"
)

func main() { os.Exit(client.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)) }
