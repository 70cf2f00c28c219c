// Package api holds the wire types shared by mpsd, mps-launch and mpsctl:
// requests, the NDJSON lease events and the status document. It has no
// behaviour, so every side of the socket agrees on one definition.
package api
