#!/usr/bin/env bash
# Fetch NVIDIA's real nvidia-cuda-mps-control (Debian non-free package
# nvidia-cuda-mps) for every suite we can reach, without installing it (the
# package would pull the whole driver). The control daemon runs without a GPU,
# so the emulator and the mps/ driver are tested against it.
#
# Usage: hack/fetch-nvidia-mps.sh [SUITE...]      (default: bookworm trixie experimental)
# Result: $MPSD_NVIDIA_MPS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/nvidia-mps)
#   <cache>/<driver-major>/usr/bin/nvidia-cuda-mps-control   (535, 550, 555, ...)
#   <cache>/<driver-major>/VERSION                           full package version
# Prints one line per generation: "<major> <version> <path-to-control>".
# Exits 0 if at least one generation is available, 1 otherwise (with the reason on stderr).
#
# No registry host is written here: the mirror is read from this machine's apt sources.
set -euo pipefail

# CI may run without HOME; take it from the user database then.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_NVIDIA_MPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/nvidia-mps}
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bookworm trixie experimental)

die() { echo "fetch-nvidia-mps: $*" >&2; exit 1; }

mirror_uri() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
		# Only a Debian archive carries non-free; skip security/other repos.
		case "$uri" in *security*) continue ;; esac
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	done
	if [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	fi
	return 1
}

command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian-family machine"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || die "debian-archive-keyring.gpg missing (apt-get install debian-archive-keyring)"
uri=$(mirror_uri) || die "no Debian mirror URI found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

found=0
for suite in "${suites[@]}"; do
	w="$work/$suite"
	mkdir -p "$w/parts" "$w/lists/partial" "$w/cache/archives/partial" "$w/dl"
	cat >"$w/parts/mps.sources" <<EOF
Types: deb
URIs: $uri
Suites: $suite
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$w/parts"
		-o "Dir::State::Lists=$w/lists" -o "Dir::Cache=$w/cache"
		-o Dir::State::Status=/dev/null -o APT::Get::List-Cleanup=0
		-o Debug::NoLocking=1 -o APT::Architecture=amd64)
	if ! apt-get "${opts[@]}" -qq update >"$w/update.log" 2>&1; then
		echo "fetch-nvidia-mps: $suite: apt-get update failed: $(tail -n1 "$w/update.log")" >&2
		continue
	fi
	version=$(apt-cache "${opts[@]}" policy nvidia-cuda-mps 2>/dev/null | awk '/Candidate:/ {print $2}')
	if [ -z "$version" ] || [ "$version" = "(none)" ]; then
		echo "fetch-nvidia-mps: $suite: no nvidia-cuda-mps candidate" >&2
		continue
	fi
	major=${version%%.*}
	dest="$cache/$major"
	if [ -x "$dest/usr/bin/nvidia-cuda-mps-control" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ]; then
		echo "$major $version $dest/usr/bin/nvidia-cuda-mps-control"
		found=1
		continue
	fi
	if ! (cd "$w/dl" && apt-get "${opts[@]}" -qq download "nvidia-cuda-mps=$version" >"$w/download.log" 2>&1); then
		echo "fetch-nvidia-mps: $suite: download of nvidia-cuda-mps $version failed: $(tail -n1 "$w/download.log")" >&2
		continue
	fi
	rm -rf "$dest.tmp"
	mkdir -p "$dest.tmp"
	dpkg-deb -x "$w"/dl/*.deb "$dest.tmp"
	echo -n "$version" >"$dest.tmp/VERSION"
	[ -x "$dest.tmp/usr/bin/nvidia-cuda-mps-control" ] || die "$suite: package $version has no usr/bin/nvidia-cuda-mps-control"
	rm -rf "$dest"
	mv "$dest.tmp" "$dest"
	echo "$major $version $dest/usr/bin/nvidia-cuda-mps-control"
	found=1
done

[ "$found" = 1 ] || die "no generation of nvidia-cuda-mps could be fetched (see messages above); cache: $cache"
