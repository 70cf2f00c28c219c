// Package archtest holds repository-wide tests of the architecture rules of
// DESIGN.md: every package documents what it owns, and only the packages
// allowed to run external programs import os/exec.
package archtest
