// Package debpkg builds mpsd's Debian package, dist/mpsd_<version>_<arch>.deb,
// with nfpm as a library (make package-deb runs it through cmd/mkdeb, after
// make build). It owns what the package holds and where (Contents: the
// three programs as make build stamped them, the systemd units, the
// default config and the logrotate file as conffiles, man pages,
// completions, docs and examples), its control fields (Depends, with
// libc6 at the newest glibc symbol version the programs need, read from
// their ELF files; Recommends, Suggests) and the maintainer scripts of
// deploy/deb, and the
// mapping of the stamped version (git describe) to a Debian version
// (DebVersion).
//
// A build is reproducible: every file, directory and archive member gets
// one modification time (the commit's, or SOURCE_DATE_EPOCH), man pages
// are gzipped without a name or a time, and the same inputs give the
// same bytes. The programs are inputs: make build's are the same bytes
// from one commit, wherever it is checked out (-trimpath), only with the
// same Go toolchain and C compiler (cgo).
//
// It never runs a program and never installs anything: the systemd
// end-to-end test (internal/systemdtest) installs what it builds with
// dpkg in a private root.
package debpkg
