// Package archtest holds repository-wide tests of the architecture rules of
// docs/architecture.md#packages: every package documents what it owns, only
// the packages allowed to run external programs import os/exec, every file
// that cites a docs/*.md file or section cites one that exists (and none
// cites the design notes the project started from, which are not in the
// repository), and cmd/mpsd is the only composition root: package mpsd
// takes no flags, does not speak to systemd, does not serve the kubelet and
// does not know it is simulated.
package archtest
