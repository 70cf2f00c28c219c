// Package archtest holds repository-wide tests of the architecture rules of
// docs/architecture.md#packages: every package documents what it owns, only
// the packages allowed to run external programs import os/exec, and every
// file that cites a docs/*.md file or section cites one that exists (and
// none cites the design notes the project started from, which are not in
// the repository).
package archtest
