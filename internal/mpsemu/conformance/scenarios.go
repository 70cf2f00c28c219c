package conformance

import (
	"bytes"
	"encoding/binary"
	"syscall"
	"time"
)

// Scenarios is the conformance suite. Every scenario starts from an empty
// scenario directory (pipe dir absent, log dir empty).
var Scenarios = []Scenario{
	{Name: "start-files-quit", Steps: []Step{
		daemon("-d"), files(), pidFile(), logDir(),
		cmd("quit"), waitDaemonExit(), files(), logDir(),
	}},
	{Name: "no-daemon", Steps: []Step{
		cmd("get_server_list"), files(),
	}},
	{Name: "second-daemon-same-pipe", Steps: []Step{
		daemon("-d"), daemon("-d"), files(), cmd("quit"), waitDaemonExit(),
	}},
	{Name: "server-list-empty", Steps: []Step{
		daemon("-d"), cmd("get_server_list"), cmd("quit"),
	}},
	{Name: "unknown-commands", Steps: []Step{
		daemon("-d"), cmd("bogus"), cmd("bogus with args"), cmd("GET_SERVER_LIST"), cmd("quit"),
	}},
	{Name: "input-framing", Steps: []Step{
		daemon("-d"),
		raw("get_default_active_thread_percentage"),
		raw("get_default_active_thread_percentage\r\n"),
		raw("   get_default_active_thread_percentage\n"),
		raw("\n\nget_default_active_thread_percentage\n\n"),
		raw(""),
		cmd("quit"),
	}},
	{Name: "several-commands-one-call", Steps: []Step{
		daemon("-d"),
		cmd("set_default_active_thread_percentage 40", "get_default_active_thread_percentage", "get_server_list", "bogus"),
		cmd("quit"),
	}},
	{Name: "default-thread-percentage", Steps: []Step{
		daemon("-d"),
		cmd("get_default_active_thread_percentage"),
		cmd("set_default_active_thread_percentage 25"),
		cmd("set_default_active_thread_percentage 33.33"),
		cmd("set_default_active_thread_percentage 100"),
		cmd("get_default_active_thread_percentage"),
		cmd("quit"),
	}},
	{Name: "default-thread-percentage-invalid", Steps: []Step{
		daemon("-d"),
		cmd("set_default_active_thread_percentage 30"),
		cmd("set_default_active_thread_percentage abc"),
		cmd("set_default_active_thread_percentage 0"),
		cmd("set_default_active_thread_percentage 101"),
		cmd("set_default_active_thread_percentage -5"),
		cmd("set_default_active_thread_percentage"),
		cmd("set_default_active_thread_percentage 50 60"),
		cmd("get_default_active_thread_percentage"),
		cmd("quit"),
	}},
	{Name: "default-pinned-mem", Steps: []Step{
		daemon("-d"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 8G"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 1500M"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 512M"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 1 8192M"),
		cmd("get_default_device_pinned_mem_limit 1"),
		cmd("quit"),
	}},
	{Name: "default-pinned-mem-loose-parser", Steps: []Step{
		daemon("-d"),
		cmd("set_default_device_pinned_mem_limit 0 3T"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 2048"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 2g"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 1.5G"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit 0 8GiB"),
		cmd("get_default_device_pinned_mem_limit 0"),
		cmd("quit"),
	}},
	{Name: "default-pinned-mem-bad-args", Steps: []Step{
		daemon("-d"),
		cmd("set_default_device_pinned_mem_limit"),
		cmd("set_default_device_pinned_mem_limit 0"),
		cmd("set_default_device_pinned_mem_limit x 8G"),
		cmd("set_default_device_pinned_mem_limit 0 abc"),
		cmd("get_default_device_pinned_mem_limit"),
		cmd("get_default_device_pinned_mem_limit 7"),
		cmd("quit"),
	}},
	{Name: "client-priority", Steps: []Step{
		daemon("-d"),
		cmd("get_default_client_priority"),
		cmd("set_default_client_priority 1"),
		cmd("get_default_client_priority"),
		cmd("set_default_client_priority 2"),
		cmd("set_default_client_priority abc"),
		cmd("set_default_client_priority"),
		cmd("get_default_client_priority"),
		cmd("quit"),
	}},
	{Name: "server-status-errors", Steps: []Step{
		daemon("-d"),
		cmd("get_server_status"),
		cmd("get_server_status 1"),
		cmd("get_server_status abc"),
		cmd("quit"),
	}},
	{Name: "start-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"),
		waitLog("Starting new server", 1),
		cmd("get_server_list"),
		serversAlive(),
		cmd("start_server -uid 0"),
		cmd("get_server_list"),
		cmd("quit -t 0"), waitDaemonExit(), serversAlive(),
	}},
	{Name: "start-server-bad-args", Steps: []Step{
		daemon("-d"),
		cmd("start_server"),
		cmd("start_server -uid"),
		cmd("start_server -uid abc"),
		cmd("start_server 0"),
		cmd("get_server_list"),
		cmd("quit"),
	}},
	{Name: "server-status-live", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("get_server_status {server}"),
		cmd("get_server_status {server} extra"),
		cmd("quit -t 0"),
	}},
	{Name: "server-thread-percentage", Steps: []Step{
		daemon("-d"),
		cmd("get_active_thread_percentage 1"),
		cmd("set_active_thread_percentage 1 50"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("set_active_thread_percentage {server} 50"),
		cmd("get_active_thread_percentage {server}"),
		cmd("quit -t 0"),
	}},
	// The per-server pinned memory commands in the form mps sends them
	// (mps.SetServerCaps: whole MiB), against no server and against one
	// still initializing (what a GPU-less daemon can show).
	{Name: "server-pinned-mem", Steps: []Step{
		daemon("-d"),
		cmd("get_device_pinned_mem_limit 1 0"),
		cmd("set_device_pinned_mem_limit 1 0 8192M"),
		cmd("get_device_pinned_mem_limit"),
		cmd("set_device_pinned_mem_limit"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("set_device_pinned_mem_limit {server} 0 8192M"),
		cmd("get_device_pinned_mem_limit {server} 0"),
		cmd("get_device_pinned_mem_limit {server}"),
		cmd("set_device_pinned_mem_limit {server} 7 1G"),
		cmd("set_device_pinned_mem_limit {server} 0"),
		cmd("quit -t 0"),
	}},
	// mps.ServerCaps and SetServerCaps send a server's caps as several
	// commands in one session: the daemon answers them in order.
	{Name: "server-caps-one-session", Steps: []Step{
		daemon("-d"),
		cmd("get_active_thread_percentage 1", "get_device_pinned_mem_limit 1 0", "get_device_pinned_mem_limit 1 1"),
		cmd("set_active_thread_percentage 1 40", "set_device_pinned_mem_limit 1 0 20480M"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("get_active_thread_percentage {server}", "get_device_pinned_mem_limit {server} 0", "get_device_pinned_mem_limit {server} 1"),
		cmd("set_active_thread_percentage {server} 40", "set_device_pinned_mem_limit {server} 0 20480M", "set_device_pinned_mem_limit {server} 1 20480M"),
		cmd("quit -t 0"),
	}},
	{Name: "client-list-and-terminate", Steps: []Step{
		daemon("-d"),
		cmd("get_client_list"),
		cmd("get_client_list 1"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("get_client_list {server}"),
		cmd("quit -t 0"),
	}},
	{Name: "shutdown-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("shutdown_server {server}"),
		waitLog("exited with status", 1).Timeout(time.Second),
		serversAlive(),
		cmd("get_server_list"),
		cmd("quit -t 0"),
	}},
	{Name: "shutdown-server-force", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("shutdown_server {server} -f"),
		waitLog("exited with status", 1),
		serversAlive(),
		killDaemon(syscall.SIGKILL),
	}},
	{Name: "shutdown-server-errors", Steps: []Step{
		daemon("-d"),
		cmd("shutdown_server"),
		cmd("shutdown_server 1"),
		cmd("shutdown_server abc -f"),
		cmd("quit"),
	}},
	{Name: "sigkill-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		killServers(syscall.SIGKILL),
		waitLog("exited with status", 1),
		cmd("get_server_list"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 2),
		cmd("get_server_list"),
		// Not quit: once a server has exited, whether NVIDIA's quit caller
		// sees status 0 or 1 is a race in the daemon.
		killDaemon(syscall.SIGKILL),
	}},
	{Name: "sigkill-daemon-stale-files", Steps: []Step{
		daemon("-d"),
		killDaemon(syscall.SIGKILL), waitDaemonExit(),
		files(),
		cmd("get_server_list"),
		daemon("-d"), files(),
		cmd("get_server_list"),
		cmd("quit"), waitDaemonExit(), files(),
	}},
	{Name: "sigterm-daemon-orphans-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		killDaemon(syscall.SIGTERM), waitDaemonExit(),
		serversAlive(),
		files(),
		cmd("get_server_list"),
	}},
	{Name: "quit-with-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		// quit without -t waits for the server, which (without a GPU) never
		// answers: the caller hangs. What a second command then gets from
		// the quitting daemon is a race in NVIDIA's daemon, so none is sent.
		cmd("quit").Timeout(time.Second),
		serversAlive(), files(),
	}},
	{Name: "quit-t0-with-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("quit -t 0"), waitDaemonExit(), serversAlive(), files(),
	}},
	{Name: "quit-t-with-server", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("quit -t 1"), waitDaemonExit(), serversAlive(), files(),
	}},
	{Name: "quit-server-ignores-sigint", Env: []string{"MPSEMU_SERVER_IGNORE_SIGINT=1"}, Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("quit -t 1").Timeout(3 * time.Second),
		serversAlive(),
	}},
	{Name: "quit-bad-args", Steps: []Step{
		daemon("-d"),
		cmd("quit -t"),
		cmd("quit -t abc"),
		cmd("quit now"),
		cmd("get_server_list"),
		cmd("quit"),
	}},
	{Name: "argv-command-no-daemon", Steps: []Step{
		argv("get_server_list"),
	}},
	{Name: "argv-command-with-daemon", Steps: []Step{
		daemon("-d"),
		argv("get_server_list"),
		argv("-h"),
		cmd("quit"),
	}},
	{Name: "foreground", Steps: []Step{
		foreground("-f"),
		waitFile("control"),
		cmd("get_server_list"),
		cmd("quit"),
		stopForeground(0),
		logDir(),
	}},
	{Name: "multiuser-server-flag", Steps: []Step{
		daemon("-d", "-multiuser-server"), files(), cmd("get_server_list"), cmd("quit"),
	}},
	{Name: "second-uid-waits", Steps: []Step{
		daemon("-d"),
		cmd("start_server -uid 0"), waitLog("Starting new server", 1),
		cmd("start_server -uid 65534"),
		cmd("get_server_list"),
		serversAlive(),
		cmd("quit -t 0"),
	}},
	// Non-root callers: 550 and newer refuse default changes to anyone
	// but root and the daemon's user (a member of its group is no
	// better than a stranger); 535 lets anyone change them. quit is
	// refused to them in every generation. Reading defaults is anyone's.
	{Name: "defaults-nonroot-callers", Steps: append(append([]Step{daemon("-d")},
		append(changeDefaults("member", "41", "1G", "1"), changeDefaults("stranger", "42", "3G", "0")...)...),
		cmd("quit").As("stranger"), cmd("quit").As("member"), cmd("quit -t 0").As("stranger"),
		cmd("get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0", "get_default_client_priority"),
		cmd("quit"), waitDaemonExit(),
	)},
	// A daemon a user started: that user may change its defaults and
	// quit it; a member of the user's group, a stranger and root are
	// answered as for a root daemon (root may do everything).
	{Name: "defaults-daemon-owner", Steps: append(append([]Step{daemon("-d").As("owner"), files()},
		append(append(append(changeDefaults("owner", "40", "2G", "1"), changeDefaults("member", "41", "1G", "0")...),
			changeDefaults("stranger", "42", "3G", "0")...), changeDefaults("", "43", "4G", "0")...)...),
		cmd("quit").As("stranger"), cmd("quit").As("member"),
		cmd("start_server -uid 0").As("owner"),
		cmd("quit").As("owner"), waitDaemonExit(), files(),
	)},
	// A server pid that is no server (a pid no process has, and the
	// daemon's own) is "not found" to every caller, before any check of
	// who asks: so the per-server rules (a server's owner lifting its own
	// caps) show only with an ACTIVE server, on a GPU (hack/gpu-check.sh).
	{Name: "unknown-server-any-caller", Steps: append(append(append([]Step{daemon("-d")},
		unknownServer("stranger")...), unknownServer("owner")...),
		append(unknownServer(""), cmd("start_server -uid 0").As("stranger"), cmd("get_server_list"), cmd("quit"))...)},
	// The log FIFO is world-writable. One header declaring 0xffffffff
	// bytes of text: the logger waits for them, so everything after it
	// (the daemon's own records too) is that text and nothing is logged
	// any more. quit then answers and closes the sockets and removes the
	// pid file, but the daemon waits for its logger for ever: it never
	// exits, keeps control_lock (a second -d is refused) and the FIFO.
	{Name: "log-fifo-poisoned", Steps: []Step{
		daemon("-d"),
		fifo(forgedHeader(recordMagic|3, 0xffffffff)),
		cmd("get_server_list"),
		cmd("set_default_active_thread_percentage 50", "get_default_active_thread_percentage"),
		cmd("quit").Timeout(2 * time.Second),
		waitDaemonExit().Timeout(time.Second),
		files(), pidFile(), logDir(),
		daemon("-d"),
		cmd("get_server_list"),
		killDaemon(syscall.SIGKILL), waitDaemonExit(), files(),
	}},
	// ... and once more than about 6 KiB of that text has come in, the
	// daemon dies (SIGSEGV), leaving its files; a new one starts.
	{Name: "log-fifo-overrun", Steps: []Step{
		daemon("-d"),
		fifo(append(forgedHeader(recordMagic|3, 0xffffffff), bytes.Repeat([]byte{'x'}, 8192)...)),
		waitDaemonExit(),
		files(), pidFile(),
		cmd("get_server_list"),
		daemon("-d"), files(),
		cmd("get_server_list"),
		cmd("quit"), waitDaemonExit(), files(),
	}},
	// A header that is no record's (a wrong magic number) stops the
	// logger: nothing is logged any more, the daemon works on and exits on
	// quit.
	{Name: "log-fifo-bad-record", Steps: []Step{
		daemon("-d"),
		fifo(forgedHeader(0, 3)),
		cmd("get_server_list"),
		cmd("quit"), waitDaemonExit(), files(), logDir(),
	}},
	// With the logger stopped nobody drains the FIFO: once it is full the
	// daemon's next record blocks it for good (no call is answered), and
	// so does a second -d's announcement.
	{Name: "log-fifo-full", Steps: []Step{
		daemon("-d"),
		fifo(append(forgedHeader(0, 3), make([]byte, 128<<10)...)),
		cmd("get_server_list").Timeout(time.Second),
		daemon("-d").Timeout(time.Second),
		files(),
		killDaemon(syscall.SIGKILL), waitDaemonExit(), files(),
	}},
}

// recordMagic is the first word of an MPS log record header, less its
// kind (mpslog).
const recordMagic = 0xabcde000

// forgedHeader is a log record header as any process may write it into
// the FIFO: first word first (the magic number and kind), pid 4242,
// 2026-01-02 03:04:05.006, declaring n bytes of text.
func forgedHeader(first, n uint32) []byte {
	b := make([]byte, 48)
	for i, v := range []uint32{first, 4242, 2026, 1, 2, 0, 3, 4, 5, 6, n, 0} {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}

// changeDefaults: user sets the three defaults, then reads them back.
func changeDefaults(user, pct, pinned, prio string) []Step {
	return []Step{
		cmd("set_default_active_thread_percentage " + pct).As(user),
		cmd("set_default_device_pinned_mem_limit 0 " + pinned).As(user),
		cmd("set_default_client_priority " + prio).As(user),
		cmd("get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0", "get_default_client_priority").As(user),
	}
}

// noServer is above the kernel's largest pid: no process has it.
const noServer = "9999999"

// unknownServer: user addresses servers that do not exist.
func unknownServer(user string) []Step {
	var steps []Step
	for _, pid := range []string{noServer, "{daemon}"} {
		steps = append(steps,
			cmd("set_active_thread_percentage "+pid+" 50").As(user),
			cmd("get_active_thread_percentage "+pid).As(user),
			cmd("set_device_pinned_mem_limit "+pid+" 0 1G").As(user),
			cmd("get_device_pinned_mem_limit "+pid+" 0").As(user),
			cmd("get_client_list "+pid).As(user),
			cmd("terminate_client "+pid+" 1").As(user),
			cmd("shutdown_server "+pid).As(user),
			cmd("shutdown_server "+pid+" -f").As(user),
			cmd("get_server_status "+pid).As(user),
		)
	}
	return steps
}
