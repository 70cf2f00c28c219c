// Package archtest holds repository-wide tests of the architecture rules of
// DESIGN.md: every package documents what it owns, only the packages
// allowed to run external programs import os/exec, and cmd/mpsd is the
// only composition root: package mpsd takes no flags, does not speak to
// systemd, does not serve the kubelet and does not know it is simulated.
package archtest
