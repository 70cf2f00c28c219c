// Package mpsd is the daemon: it owns the MPS instances (one control daemon
// per GPU set and tenant group), admission and the per-group queues, the
// watchdog that restarts failed instances and requeues their leases, the API
// server on the unix socket, the persisted state, the history of ended
// leases (history.go) and the metrics.
//
// A lease and an instance each have one state value with a table of legal
// transitions (leasestate.go: queued, running, revoking, releasing, ended;
// instancestate.go: starting, up, recovering, stopping, stopped, plus the
// holds that close an instance to placements); every change goes through
// their step method, and an illegal one is logged and reported. Every
// revocation (a fault's, an operator's, one a restart finds unfinished)
// goes through Daemon.revoke (revoke.go). Every end of a lease is
// recorded through Daemon.recordEnded, and reported only once the history
// file has it. Each instance has one
// supervisor goroutine (supervisor.go) that alone brings its daemon up,
// recovers it, probes it and stops it, one piece at a time; faults and
// stop requests only ask it.
//
// It never runs external programs itself (that is package mps) and never
// decides policy (that is package policy): it applies decisions.
package mpsd
