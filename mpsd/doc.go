// Package mpsd is the daemon: it owns the MPS instances (one control daemon
// per GPU set and tenant group), admission and the per-group queues, the
// watchdog that restarts failed instances and requeues their leases, the API
// server on the unix socket, the persisted state and the metrics.
//
// It never runs external programs itself (that is package mps) and never
// decides policy (that is package policy): it applies decisions.
package mpsd
