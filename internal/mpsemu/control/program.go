package control

import (
	"fmt"
	"io"
	"os"
)

// Main is the nvidia-cuda-mps-control program. getenv reads the
// environment (MPSEMU_DRIVER or MPSEMU_DRIVER_VERSION picks the
// generation, see selectGeneration); the return value is
// the exit status.
func Main(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	if getenv(execFailedEnv) == "1" {
		return 1
	}
	gen, err := selectGeneration(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (emulator): %v\n", err)
		return 1
	}
	m, multiuser, exit := gen.parseArgs(args)
	d := dirsFrom(getenv)
	switch m {
	case modeHelp:
		io.WriteString(stdout, gen.Help())
		return exit
	case modeClient:
		return runClient(d.pipe, stdin, stdout, stderr)
	case modeForeground:
		logs := prepareLogDir(d.log, stdout)
		if logs {
			announce(d)
		}
		return newDaemon(gen, d, true, multiuser, logs, stdout).run(nil)
	}
	mark := getenv(childEnv)
	if mark == "" {
		return runDaemonParent(d, stdout)
	}
	// The re-executed daemon: fd 3 is the parent's readiness pipe.
	os.Unsetenv(childEnv)
	ready := os.NewFile(3, "ready")
	return newDaemon(gen, d, false, multiuser, mark != "nolog", stdout).run(ready)
}
