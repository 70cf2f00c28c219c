// Package launcher is the library behind mps-launch: flag and size parsing,
// the lease client that talks to mpsd over its unix socket, running the
// user's command with the MPS environment of a granted lease, and the
// requeue loop that relaunches the command when mpsd requeues the lease.
//
// It never touches MPS or cgroups directly: mpsd does, as root.
package launcher
