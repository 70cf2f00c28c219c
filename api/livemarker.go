package api

// LiveMarker is the file beside mpsd's API socket that says an mpsd
// serves the socket or is coming back to it: the socket's path with
// ".live" added. mpsd makes it once it serves a socket it listens on
// itself; a stop that leaves the MPS service running (SIGTERM, a restart,
// a crash) leaves it, so the next mpsd is waited for; `mpsctl shutdown`,
// which ends the service, removes it and then the socket. Under socket
// activation there is none (systemd holds the socket: a client's connect
// waits in its backlog). A launcher whose connect is refused, or finds no
// socket, before mpsd ever answered it waits for mpsd only while the
// marker is there; otherwise it fails at once.
func LiveMarker(socket string) string { return socket + ".live" }
