package control

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// Generation is the NVIDIA driver generation the emulator imitates; their
// control daemons differ in small, observable ways.
type Generation int

// Generations seen in Debian: bookworm 535.261.03, trixie 550.163.01,
// experimental 555.58.02; and 580.159.04 (CUDA 13.0), seen on an H200
// (docs/gpu-probe), which behaves as 555 plus the lines it adds to its
// logs (BinaryVersion, EchoesPinnedDefault).
const (
	Gen535 Generation = 535
	Gen550 Generation = 550
	Gen555 Generation = 555
	Gen580 Generation = 580
)

// DefaultGeneration is used when MPSEMU_DRIVER is unset.
const DefaultGeneration = Gen550

// ErrGeneration reports an MPSEMU_DRIVER value the emulator does not know.
var ErrGeneration = errors.New("control: unknown driver generation")

// ParseGeneration reads MPSEMU_DRIVER ("" is the default).
func ParseGeneration(s string) (Generation, error) {
	switch s {
	case "":
		return DefaultGeneration, nil
	case "535":
		return Gen535, nil
	case "550":
		return Gen550, nil
	case "555":
		return Gen555, nil
	case "580":
		return Gen580, nil
	}
	return 0, fmt.Errorf("%w: MPSEMU_DRIVER=%q (want 535, 550, 555 or 580)", ErrGeneration, s)
}

// GenerationForDriver is the generation the emulator imitates for a
// driver of version v ("570.172.08", as NVML's SystemGetDriverVersion
// reports it, or its major alone): the newest one it knows that is not
// newer than v. Drivers from 555 on all take -multiuser-server; from 580
// on they write 580's version lines. Drivers older than 535 are not
// emulated.
func GenerationForDriver(v string) (Generation, error) {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil || major != strconv.Itoa(n) {
		return 0, fmt.Errorf("%w: driver version %q (want MAJOR[.MINOR...], e.g. 570.172.08)", ErrGeneration, v)
	}
	for _, g := range []Generation{Gen580, Gen555, Gen550, Gen535} {
		if n >= int(g) {
			return g, nil
		}
	}
	return 0, fmt.Errorf("%w: driver version %q is older than 535, the oldest generation emulated", ErrGeneration, v)
}

// SelectGeneration is the generation the emulator's programs imitate,
// from their environment (see selectGeneration): the control program's,
// and the server's, which inherits the daemon's environment.
func SelectGeneration(getenv func(string) string) (Generation, error) {
	return selectGeneration(getenv)
}

// selectGeneration is the generation of the control program's
// environment: MPSEMU_DRIVER names one outright; else
// MPSEMU_DRIVER_VERSION, the driver a simulated GPU reports (mpsd
// --simulate sets it), picks the one that driver's daemon behaves as;
// else DefaultGeneration.
func selectGeneration(getenv func(string) string) (Generation, error) {
	if g := getenv("MPSEMU_DRIVER"); g != "" {
		return ParseGeneration(g)
	}
	if v := getenv("MPSEMU_DRIVER_VERSION"); v != "" {
		return GenerationForDriver(v)
	}
	return DefaultGeneration, nil
}

// BinaryVersion is the "CUDA MPS Control binary version" a 580 daemon
// logs as it starts, and its server in server.log: the CUDA version the
// driver implements (13000 for 13.0, seen on an H200 with 580.159.04).
// Older generations log none: 0.
func (g Generation) BinaryVersion() int {
	if g >= Gen580 {
		return 13000
	}
	return 0
}

// EchoesPinnedDefault: a 580 daemon logs the accepted command line of
// set_default_device_pinned_mem_limit again, with a period
// ("set_default_device_pinned_mem_limit 0 4096M."), seen on an H200.
func (g Generation) EchoesPinnedDefault() bool { return g >= Gen580 }

// HasPIDFile: 535 writes no nvidia-cuda-mps-control.pid.
func (g Generation) HasPIDFile() bool { return g >= Gen550 }

// HasServerStatus: 535 has no get_server_status command.
func (g Generation) HasServerStatus() bool { return g >= Gen550 }

// StrictArgv: 555 prints the help and exits 1 on any argument it does not
// know; older ones run as a client and read stdin.
func (g Generation) StrictArgv() bool { return g >= Gen555 }

// HasMultiuser: only 555 and newer know -multiuser-server; older ones treat
// it as an unknown argument.
func (g Generation) HasMultiuser() bool { return g >= Gen555 }

// LogsForceShutdown: 535 sends SIGINT without logging "Force shutting down".
func (g Generation) LogsForceShutdown() bool { return g >= Gen550 }

// ServerStartLogPID is the pid in the bracket of "Starting new server":
// 535's daemon logs it itself, newer ones log it from the forked server.
func (g Generation) ServerStartLogPID(daemonPID, serverPID int) int {
	if g == Gen535 {
		return daemonPID
	}
	return serverPID
}

// SettingsNeedPrivilege: from 550 on, only root or the daemon's user may
// change the daemon's defaults; 535 lets anyone.
func (g Generation) SettingsNeedPrivilege() bool { return g >= Gen550 }

// What a privilege message is about.
type privilege int

const (
	privStart privilege = iota
	privShutdown
	privSettings
	privServerSettings
	privTerminate
)

// Insufficient is the refusal for caller uid; 535 prints only the first
// sentence.
func (g Generation) Insufficient(p privilege, uid uint32) string {
	msg := fmt.Sprintf("Insufficient privileges for UID %d", uid)
	if g == Gen535 {
		return msg
	}
	switch p {
	case privStart:
		return msg + ". Only the root user may start server for another user."
	case privShutdown:
		return msg + ". Only the root user may shutdown another user's server."
	case privSettings:
		return msg + ". Control deamon settings can only be modified by the user started it or by the root user."
	case privServerSettings:
		return msg + ". Only the root user may change settings for another user's server."
	default:
		return msg + ". Only the root user may terminate clients on another user's server."
	}
}

// Help is the text printed for -h, --help and (555) bad arguments.
func (g Generation) Help() string {
	year := "2023"
	if g >= Gen555 {
		year = "2024"
	}
	return "CUDA MPS Control for Linux/Unix.\n" +
		"Copyright (C) 2003 - " + year + " NVIDIA Corporation.\n" +
		"\n" +
		"  This program allows multiple CUDA processes to share a single GPU context. For information on how to use the CUDA MPS, see the nvidia-cuda-mps-control manual page.\n" +
		"\n"
}

// mode is what the command line asks for.
type mode int

const (
	modeClient mode = iota
	modeDaemon
	modeForeground
	modeHelp
)

// parseArgs interprets argv (without the program name) as generation g
// does. exit is the status for modeHelp.
func (g Generation) parseArgs(args []string) (m mode, multiuser bool, exit int) {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		return modeHelp, false, 0
	}
	if !g.StrictArgv() {
		if len(args) == 1 && args[0] == "-d" {
			return modeDaemon, false, 0
		}
		if len(args) == 1 && args[0] == "-f" {
			return modeForeground, false, 0
		}
		return modeClient, false, 0
	}
	m = modeClient
	for _, a := range args {
		switch {
		case a == "-d":
			m = modeDaemon
		case a == "-f":
			m = modeForeground
		case a == "-multiuser-server" && g.HasMultiuser():
			multiuser = true
		default:
			return modeHelp, false, 1
		}
	}
	return m, multiuser, 0
}

// LogRoom is how much text of one log record NVIDIA's logger thread
// survives (mpslog.Room): records of up to Line bytes are logged; a longer
// one kills the daemon (SIGSEGV) once Read+1 bytes of its text, or all of
// it if less, have come in. Measured on each generation's daemon: Line
// with records of their declared length, Read with the daemon's own
// records after a header declaring 0xffffffff (other bytes move it by a
// byte or two). 580 is taken to be 555.
func (g Generation) LogRoom() mpslog.Room {
	switch g {
	case Gen535:
		return mpslog.Room{Line: 6167, Read: 6243}
	case Gen550:
		return mpslog.Room{Line: 6183, Read: 6258}
	}
	return mpslog.Room{Line: 6183, Read: 6259}
}
