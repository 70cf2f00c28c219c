#!/usr/bin/env bash
# Fetch Prometheus's promtool and prometheus (Debian package prometheus)
# without installing them (no service, no user, no dependencies), so the tests
# can run `promtool check rules` and `promtool test rules` on the shipped
# alert rules (examples/prometheus/).
#
# Usage: hack/fetch-prometheus.sh [SUITE]      (default: bookworm)
# Result: $MPSD_PROMETHEUS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/prometheus)
#   <cache>/usr/bin/promtool
#   <cache>/usr/bin/prometheus
#   <cache>/VERSION            full package version
# Prints one line: "<version> <path-to-promtool>".
# Idempotent: a cache holding the archive's current version is kept as is; if
# the archive cannot be reached, an existing cache is used (with a note).
# Exits 0 when promtool is available, 1 otherwise (with the reason on stderr).
#
# No registry host is written here: the mirror is read from this machine's apt sources.
set -euo pipefail

# CI may run without HOME; take it from the user database then.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/prometheus}
suite=${1:-bookworm}

die() { echo "fetch-prometheus: $*" >&2; exit 1; }

# have prints the cached promtool and succeeds if the cache is usable.
have() {
	[ -x "$cache/usr/bin/promtool" ] && [ -x "$cache/usr/bin/prometheus" ] || return 1
	echo "$(cat "$cache/VERSION" 2>/dev/null || echo unknown) $cache/usr/bin/promtool"
}

# fallback uses an existing cache when the archive is out of reach.
fallback() {
	echo "fetch-prometheus: $*" >&2
	if have; then
		echo "fetch-prometheus: using the cached copy in $cache" >&2
		exit 0
	fi
	die "no cached copy in $cache either"
}

mirror_uri() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
		case "$uri" in *security*) continue ;; esac
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	done
	if [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
		[ -n "$uri" ] && { echo "$uri"; return 0; }
	fi
	return 1
}

command -v apt-get >/dev/null || fallback "apt-get not found: this script needs a Debian-family machine"
command -v dpkg-deb >/dev/null || fallback "dpkg-deb not found"
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || fallback "debian-archive-keyring.gpg missing (apt-get install debian-archive-keyring)"
uri=$(mirror_uri) || fallback "no Debian mirror URI found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial" "$work/dl"
cat >"$work/parts/prometheus.sources" <<EOF
Types: deb
URIs: $uri
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
	-o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
	-o Dir::State::Status=/dev/null -o APT::Get::List-Cleanup=0
	-o Debug::NoLocking=1 -o APT::Architecture=amd64)
if ! apt-get "${opts[@]}" -qq update >"$work/update.log" 2>&1; then
	fallback "$suite: apt-get update failed: $(tail -n1 "$work/update.log")"
fi
version=$(apt-cache "${opts[@]}" policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	fallback "$suite: no prometheus candidate"
fi
if [ "$(cat "$cache/VERSION" 2>/dev/null)" = "$version" ] && have; then
	exit 0
fi
if ! (cd "$work/dl" && apt-get "${opts[@]}" -qq download "prometheus=$version" >"$work/download.log" 2>&1); then
	fallback "$suite: download of prometheus $version failed: $(tail -n1 "$work/download.log")"
fi
tmp="$cache.tmp"
mkdir -p "$(dirname "$cache")"
rm -rf "$tmp"
mkdir -p "$tmp"
dpkg-deb -x "$work"/dl/*.deb "$tmp"
echo -n "$version" >"$tmp/VERSION"
for b in promtool prometheus; do
	[ -x "$tmp/usr/bin/$b" ] || die "$suite: package $version has no usr/bin/$b"
done
rm -rf "$cache"
mv "$tmp" "$cache"
have
