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
#   <cache>/<package>_<version>_<arch>.control   its control paragraph
#     (dpkg-deb -f), which the image lists in /var/lib/dpkg/status.d
# Prints the tars' paths, one a line. A cached .deb is not fetched again;
# where apt cannot download the installed version (the apt lists are empty,
# as on a fresh CI machine, or no longer name it) it runs apt-get update
# once and tries again, showing apt's errors when that fails too.
#
# Every run, cached or not, checks the files of each package's tar
# against what dpkg recorded when it installed that package here
# (/var/lib/dpkg/info/<package>:<arch>.md5sums, and the conffiles' sums in
# dpkg's status): the programs were linked
# against those files, and a mirror's, a cache's or a proxy's other bytes
# under the same name and version are refused.
# Exits 1 when a package is not installed here, cannot be fetched, or its
# files differ from the installed package's.
set -euo pipefail

# The image's packages: the C library (mpsd, mpsctl and the MPS
# emulator are linked with it) and libgcc-s1, which it depends on (glibc
# loads libgcc_s for thread cancellation and unwinding), and the
# gcc-N-base that libgcc-s1 depends on: it holds libgcc's copyright file
# (/usr/share/doc/libgcc-s1 is a link to its directory).
packages=(libc6 libgcc-s1)

: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_IMAGE_DEBS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/image-debs}
mkdir -p "$cache"
arch=$(dpkg --print-architecture)

die() { echo "fetch-image-debs: $*" >&2; exit 1; }

gccbase=$(dpkg-query -W -f '${Depends}' "libgcc-s1:$arch") || die "libgcc-s1 is not installed on this machine (apt-get install libgcc-s1)"
gccbase=$(grep -o 'gcc-[0-9]*-base' <<<"$gccbase" | head -n1) || die "libgcc-s1 depends on no gcc-N-base here"
packages+=("$gccbase")

# verify checks the files of the tar $2 against the md5sums dpkg keeps for
# the installed package $1.
verify() {
	local p=$1 tar=$2 sums dir bad
	sums=/var/lib/dpkg/info/$p:$arch.md5sums
	[ -f "$sums" ] || sums=/var/lib/dpkg/info/$p.md5sums
	[ -s "$sums" ] || die "$p: dpkg keeps no md5sums of its files here ($sums): cannot check $tar"
	dir=$(mktemp -d "$cache/.verify.XXXXXX")
	# The conffiles' sums are in dpkg's status, as the package shipped
	# them (" /etc/x <md5>", "obsolete" after some).
	dpkg-query -W -f '${Conffiles}\n' "$p:$arch" | awk 'NF >= 2 { sub(/^\//, "", $1); print $2 "  " $1 }' >"$dir.conffiles" ||
		{ rm -rf "$dir" "$dir.conffiles"; die "$p: dpkg-query cannot list its conffiles"; }
	if ! tar -xf "$tar" -C "$dir"; then
		rm -rf "$dir"
		die "$p: cannot unpack $tar"
	fi
	local lists=("$sums")
	[ ! -s "$dir.conffiles" ] || lists+=("$dir.conffiles")
	if ! bad=$(cd "$dir" && md5sum --check --quiet "${lists[@]}" 2>&1); then
		rm -rf "$dir" "$dir.conffiles"
		die "$p: $tar is not the package installed here (its files against $sums):
$bad
remove $cache/${tar##*/} and ${tar%.tar}.deb to fetch it again"
	fi
	rm -rf "$dir" "$dir.conffiles"
}

updated=
for p in "${packages[@]}"; do
	v=$(dpkg-query -W -f '${Version}' "$p:$arch" 2>/dev/null) || die "$p is not installed on this machine (apt-get install $p)"
	base="${p}_${v//:/%3a}_$arch"
	deb="$cache/$base.deb" tar="$cache/$base.tar"
	if [ ! -s "$deb" ]; then
		tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
		if ! first=$(cd "$tmp" && apt-get download -qq "$p:$arch=$v" 2>&1); then
			if [ -z "$updated" ]; then
				echo "fetch-image-debs: apt-get download $p=$v: ${first:-failed}; apt-get update, then again" >&2
				apt-get update -qq >&2 || echo "fetch-image-debs: apt-get update failed (its errors above); downloading anyway" >&2
				updated=1
			fi
			(cd "$tmp" && apt-get download -qq "$p:$arch=$v" >&2) || { rm -rf "$tmp"; die "cannot fetch $p=$v (apt-get download's errors above)"; }
		fi
		mv "$tmp"/*.deb "$deb"
		rm -rf "$tmp"
		rm -f "$tar"
	fi
	if [ ! -s "$tar" ]; then
		dpkg-deb --fsys-tarfile "$deb" >"$tar.tmp" || { rm -f "$tar.tmp"; die "cannot unpack $deb"; }
		mv "$tar.tmp" "$tar"
	fi
	verify "$p" "$tar"
	control="$cache/$base.control"
	if [ ! -s "$control" ]; then
		dpkg-deb -f "$deb" >"$control.tmp" || { rm -f "$control.tmp"; die "cannot read the control of $deb"; }
		mv "$control.tmp" "$control"
	fi
	# It names the package installed here.
	got=$(dpkg-deb -f "$deb" Package Version Architecture 2>&1 | sed -n 's/^[A-Za-z]*: //p' | tr '\n' ' ')
	want=$(dpkg-query -W -f '${Package} ${Version} ${Architecture} ' "$p:$arch")
	[ "$got" = "$want" ] || die "$deb is $got, not the installed $want"
	grep -qx "Version: $v" "$control" || die "$control does not name version $v: remove it to write it again"
	echo "$tar"
done
