// Package mpsctl is the library behind mpsctl, the operator's command line
// for mpsd (docs/architecture.md#processes): cmd/mpsctl only calls Main.
//
// What it owns:
//   - the command line: the global --socket flag (else $MPSD_SOCKET, else
//     api.DefaultSocket), the command table (commands.go) and the usage
//     text generated from it, and the exit statuses: 0 success, 1 mpsd
//     refused or failed, could not be reached, or the config is invalid,
//     2 usage error (ExitCode);
//   - the client side of mpsd's admin and status requests (Client), one
//     connection per request over the unix socket, with the error
//     document of package api decoded into one line: status, drain,
//     resume, restart, requeue of one lease, inject-xid (a simulated
//     Xid, which only mpsd --simulate accepts) and version (mpsctl's
//     build and mpsd's); and the one line, once, that says mpsd serves a
//     lower API level than a command needs (command.level);
//   - how those answers are shown: the status tables (default and -o
//     wide, or rows only), the --json document as mpsd sent it (indented,
//     unknown fields kept), both narrowed by status's filters (status.go),
//     status --watch's redrawing on Config.Clock, one line per
//     instance an admin command changed (requeue: the instance the lease
//     was on);
//   - check-config: a config file checked by package policy against this
//     host's GPUs (NVML), the config's simulated GPUs (--simulate), or no
//     GPUs when NVML is unavailable, with a note saying so; and its
//     run_dir, state_dir and log_dir as they are on this host (only root
//     may be able to change them or their ancestors), as mpsd checks
//     them at start.
//
// It never runs programs, never touches MPS, cgroups or mpsd's files
// (everything goes through the API, which authorizes by peer credentials),
// never retries a request, and never logs: what it says is its output on
// stdout and one line per failure on stderr.
package mpsctl
