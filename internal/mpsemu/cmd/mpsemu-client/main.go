// Command mpsemu-client is the MPS emulator's stand-in CUDA application; see
// internal/mpsemu/client.
package main

import (
	"os"

	"github.com/mpsd/mpsd/internal/mpsemu/client"
)

func main() { os.Exit(client.MainEnv(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)) }
