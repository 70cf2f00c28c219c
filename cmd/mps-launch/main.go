// Command mps-launch runs a program on a GPU shared through CUDA MPS,
// under a lease from mpsd: `mps-launch --sm 30 --mem 8G -- ./infer`.
// Everything is in package launcher; see its documentation and
// docs/architecture.md#mps-launchs-command-line-and-exit-statuses for the
// flags and exit statuses.
package main

import (
	"context"
	"os"

	"github.com/mpsd/mpsd/launcher"
)

func main() {
	os.Exit(launcher.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
}
