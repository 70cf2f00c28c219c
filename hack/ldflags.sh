#!/usr/bin/env bash
# Prints the go build -ldflags that stamp the version, the commit and its
# time into mpsd's binaries (package internal/buildinfo), for make build.
# Run from the repository root. Where the root is a git work tree's:
# `git describe --tags --always --dirty --abbrev=12`, the HEAD commit and
# its time. The abbreviation's length is fixed: git's default follows the
# repository's object count and core.abbrev, so a shallow and a full
# clone of one commit would stamp different versions.
# Otherwise (a release tarball), the VERSION file at the root, whose
# first line is "VERSION [COMMIT [TIME]]", e.g.
#   v1.2.0 0123456789abcdef0123456789abcdef01234567 2026-12-01T14:00:00Z
# With neither it prints nothing, and the binaries say what the Go linker
# recorded ("(devel)" at least). A value with characters outside
# [A-Za-z0-9._+:-] is refused: it would not survive -ldflags' quoting.
set -euo pipefail

pkg=github.com/mpsd/mpsd/internal/buildinfo
version= commit= time=
# Only the repository whose root this is: a tarball unpacked inside
# another repository must not take that one's version.
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
	version=$(git describe --tags --always --dirty --abbrev=12)
	commit=$(git rev-parse HEAD)
	time=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)
elif [ -f VERSION ]; then
	read -r version commit time _ <VERSION || true # a last line without a newline still counts
fi
for v in "$version" "$commit" "$time"; do
	if [[ ! $v =~ ^[A-Za-z0-9._+:-]*$ ]]; then
		echo "hack/ldflags.sh: version field \"$v\" has characters outside [A-Za-z0-9._+:-]" >&2
		exit 1
	fi
done
if [ -n "$version" ]; then
	echo "-X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.commitTime=$time"
fi
