#!/usr/bin/env bash
# Fetch the Debian packages whose files make the user space of mpsd's
# container image (make package-image, internal/ociimage), at the very
# versions installed on this machine, and unpack each to the tar of its
# files (dpkg-deb --fsys-tarfile) for the image builder.
#
# Why the host's versions: mpsd and mpsctl are cgo programs linked here
# against this machine's C library; the image's must be the same (or
# newer), and pinning it makes two builds on one machine identical.
#
# Usage: hack/fetch-image-debs.sh
# Result: $MPSD_IMAGE_DEBS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/image-debs)
#   <cache>/<package>_<version>_<arch>.deb
#   <cache>/<package>_<version>_<arch>.tar   its files
# Prints the tars' paths, one a line. A cached .deb is not fetched again;
# with empty apt lists (a fresh CI machine) it runs apt-get update once.
# Exits 1 when a package is not installed here or cannot be fetched.
set -euo pipefail

# The image's packages: the C library (mpsd, mpsctl and the MPS
# emulator are linked with it) and libgcc-s1, which it depends on (glibc
# loads libgcc_s for thread cancellation and unwinding).
packages=(libc6 libgcc-s1)

: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_IMAGE_DEBS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/image-debs}
mkdir -p "$cache"
arch=$(dpkg --print-architecture)

die() { echo "fetch-image-debs: $*" >&2; exit 1; }

updated=
for p in "${packages[@]}"; do
	v=$(dpkg-query -W -f '${Version}' "$p:$arch" 2>/dev/null) || die "$p is not installed on this machine (apt-get install $p)"
	base="${p}_${v//:/%3a}_$arch"
	deb="$cache/$base.deb" tar="$cache/$base.tar"
	if [ ! -s "$deb" ]; then
		tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
		if ! (cd "$tmp" && apt-get download -qq "$p:$arch=$v" 2>/dev/null); then
			if [ -z "$updated" ]; then
				echo "fetch-image-debs: $p=$v not in the apt lists; apt-get update" >&2
				apt-get update -qq >&2 || true
				updated=1
			fi
			(cd "$tmp" && apt-get download -qq "$p:$arch=$v" >&2) || { rm -rf "$tmp"; die "cannot fetch $p=$v"; }
		fi
		mv "$tmp"/*.deb "$deb"
		rm -rf "$tmp"
		rm -f "$tar"
	fi
	if [ ! -s "$tar" ]; then
		dpkg-deb --fsys-tarfile "$deb" >"$tar.tmp"
		mv "$tar.tmp" "$tar"
	fi
	echo "$tar"
done
