// Package apitest is a fake mpsd for tests of mpsd's API clients (mps-launch, mpsctl, the device plugin): it serves
// package api's lease protocol over a unix socket in a temporary
// directory, checks requests as strictly as mpsd must (strict decoding,
// attach only of the caller's own child, by SO_PEERCRED), records what
// the launcher did, and lets each test script the events.
//
// It never runs programs, touches cgroups or MPS; "killing the lease's
// cgroup" is the test's own kill of the attached pid.
package apitest
