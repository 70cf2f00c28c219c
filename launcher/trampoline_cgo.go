//go:build cgo

package launcher

/*
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// These must match trampolineEnv and releaseByte.
#define MPSD_TRAMPOLINE_ENV "MPSD_LAUNCH_TRAMPOLINE"
#define MPSD_RELEASE_BYTE 'x'
#define MPSD_EXIT_FAILURE 125
#define MPSD_EXIT_NOT_EXECUTABLE 126
#define MPSD_EXIT_NOT_FOUND 127

// The signals mps-launch forwards (forwarded in trampoline.go).
static const int mpsd_forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
#define MPSD_NFORWARDED (sizeof mpsd_forwarded / sizeof mpsd_forwarded[0])

// mpsd_read_all reads fd to its end into a fresh buffer, or returns NULL.
static char *mpsd_read_all(int fd, size_t *len) {
	size_t cap = 4096;
	char *buf = malloc(cap);
	*len = 0;
	for (;;) {
		if (buf == NULL) {
			return NULL;
		}
		if (*len == cap) {
			cap *= 2;
			char *bigger = realloc(buf, cap);
			if (bigger == NULL) {
				free(buf);
			}
			buf = bigger;
			continue;
		}
		ssize_t n = read(fd, buf + *len, cap - *len);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0) {
			free(buf);
			return NULL;
		}
		if (n == 0) {
			return buf;
		}
		*len += (size_t)n;
	}
}

// mpsd_split returns the NUL-terminated strings of buf[0:len] as a
// NULL-terminated array (a last string without its NUL is dropped), or
// NULL.
static char **mpsd_split(char *buf, size_t len, int *count) {
	int n = 0;
	for (size_t i = 0; i < len; i++) {
		n += buf[i] == '\0';
	}
	char **v = calloc((size_t)n + 1, sizeof *v);
	if (v == NULL) {
		return NULL;
	}
	char *p = buf;
	for (int i = 0; i < n; i++) {
		v[i] = p;
		p += strlen(p) + 1;
	}
	*count = n;
	return v;
}

// mpsd_pipe_fd parses a descriptor number of the trampoline's variable
// ("R,E", parsePipeFDs) from *p up to stop, and checks that it is a pipe;
// it returns -1 if not.
static int mpsd_pipe_fd(const char **p, char stop) {
	long fd = 0;
	const char *s = *p;
	if (!isdigit((unsigned char)*s)) {
		return -1;
	}
	for (; isdigit((unsigned char)*s) && fd <= 1 << 20; s++) {
		fd = fd * 10 + (*s - '0');
	}
	struct stat st;
	if (*s != stop || fd <= 2 || fd > 1 << 20 || fstat((int)fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
		return -1;
	}
	*p = s + 1;
	return (int)fd;
}

// mpsd_launch_trampoline runs before the Go runtime in every process of a
// binary that links package launcher. Unless the environment selects
// trampoline mode it returns at once; otherwise the process never reaches
// Go: it waits for the release message, then execs the program with the
// environment the message carries.
__attribute__((constructor)) static void mpsd_launch_trampoline(void) {
	const char *mode = getenv(MPSD_TRAMPOLINE_ENV);
	if (mode == NULL || mode[0] == '\0') {
		return;
	}
	// While it waits, possibly for as long as the request is queued, the
	// signals a terminal sends the process group are mps-launch's to act
	// on, not this process's to die of; the program gets the dispositions
	// mps-launch was started with.
	struct sigaction saved[MPSD_NFORWARDED];
	struct sigaction ignore;
	memset(&ignore, 0, sizeof ignore);
	ignore.sa_handler = SIG_IGN;
	sigemptyset(&ignore.sa_mask);
	for (size_t i = 0; i < MPSD_NFORWARDED; i++) {
		sigaction(mpsd_forwarded[i], &ignore, &saved[i]);
	}
	// argv comes from /proc: a constructor gets no arguments portably.
	size_t len = 0;
	int argc = 0;
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	char *cmdline = fd < 0 ? NULL : mpsd_read_all(fd, &len);
	char **argv = cmdline == NULL ? NULL : mpsd_split(cmdline, len, &argc);
	if (fd >= 0) {
		close(fd);
	}
	if (argv == NULL || argc < 3) {
		dprintf(2, "mps-launch: trampoline started without a command\n");
		_exit(MPSD_EXIT_FAILURE);
	}
	const char *fds = mode;
	int release_fd = mpsd_pipe_fd(&fds, ',');
	int exec_fd = release_fd < 0 ? -1 : mpsd_pipe_fd(&fds, '\0');
	if (exec_fd < 0 || exec_fd == release_fd) {
		dprintf(2, "mps-launch: trampoline started without its pipes\n");
		_exit(MPSD_EXIT_FAILURE);
	}
	char *msg = mpsd_read_all(release_fd, &len);
	if (msg == NULL || len == 0 || msg[0] != MPSD_RELEASE_BYTE) {
		_exit(MPSD_EXIT_FAILURE);
	}
	close(release_fd);
	for (size_t i = 0; i < MPSD_NFORWARDED; i++) {
		sigaction(mpsd_forwarded[i], &saved[i], NULL);
	}
	// From here on a forwarded signal reaches this process with the
	// program's dispositions: mps-launch may send them.
	const char ack = MPSD_RELEASE_BYTE;
	while (write(exec_fd, &ack, 1) < 0 && errno == EINTR) {
	}
	// Neither pipe reaches the program: it gets the caller's descriptors
	// and no others.
	close(exec_fd);
	int envc = 0;
	char **envp = mpsd_split(msg + 1, len - 1, &envc);
	if (envp == NULL) {
		_exit(MPSD_EXIT_FAILURE);
	}
	execve(argv[1], argv + 2, envp);
	int err = errno;
	char why[256];
	snprintf(why, sizeof why, "%s", strerror(err));
	why[0] = (char)tolower((unsigned char)why[0]); // Go's spelling of errno texts
	dprintf(2, "mps-launch: cannot execute %s: %s\n", argv[1], why);
	_exit(err == ENOENT || err == ENOTDIR ? MPSD_EXIT_NOT_FOUND : MPSD_EXIT_NOT_EXECUTABLE);
}
*/
import "C"

import (
	"fmt"
	"io"
)

// trampoline is reached only when Main is handed an environment that
// selects trampoline mode while the process's own does not (the C
// constructor serves every real trampoline before Go starts): a caller's
// mistake, refused rather than exec'ing over the caller.
func trampoline(_, _ []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "mps-launch: %s is set in the environment given to Main but not in the process's\n", trampolineEnv)
	return ExitFailure
}
