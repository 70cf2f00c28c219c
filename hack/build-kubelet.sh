#!/usr/bin/env bash
# Build the kubelet from the k8s.io/kubernetes module, for the kubelet
# end-to-end test (examples/kubernetes/kubelet_e2e_test.go), and cache the
# binary outside the repository.
#
# `go install k8s.io/kubernetes/cmd/kubelet@vX` refuses: the kubernetes module
# replaces its 33 staging modules (k8s.io/api, k8s.io/client-go, ...) with
# directories of its own tree. A wrapper module, generated in a temp dir,
# requires k8s.io/kubernetes and replaces each staging module with its
# published release (k8s.io/<name> v0.<minor>.<patch>).
#
# Usage: hack/build-kubelet.sh [VERSION]     (default: v1.37.2; stay on 1.37.x:
#   1.38 needs containerd 2.x, which Debian does not ship)
# Result: $MPSD_KUBELET_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/kubelet)
#   <cache>/kubelet     static binary (CGO_ENABLED=0)
#   <cache>/VERSION     the kubernetes version it was built from
# Prints one line: "<version> <path-to-kubelet>".
# Idempotent: a cache holding that version is kept as is. A cold build takes
# about 560 CPU-seconds and 2 GiB of memory; the Go build cache makes a
# rebuild take seconds.
# Exits 0 when the kubelet is available, 1 otherwise (with the reason on stderr).
set -euo pipefail

# CI may run without HOME; take it from the user database then.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_KUBELET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/kubelet}
version=${1:-v1.37.2}
GO=${GO:-go}

die() { echo "build-kubelet: $*" >&2; exit 1; }

have() {
	[ -x "$cache/kubelet" ] && [ "$(cat "$cache/VERSION" 2>/dev/null)" = "$version" ] || return 1
	echo "$version $cache/kubelet"
}

case "$version" in
v1.*.*) ;;
*) die "version $version: want v1.<minor>.<patch>" ;;
esac
have && exit 0
command -v "$GO" >/dev/null || die "go not found"

# v1.37.2 -> v0.37.2: the staging modules' tags.
staging_version="v0.${version#v1.}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$GO" mod init mpsd.invalid/kubelet-build >/dev/null 2>&1

# The kubernetes module's own go.mod names its staging replacements.
kmod=$("$GO" mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$kmod" ] || [ ! -r "$kmod" ]; then die "k8s.io/kubernetes@$version: go mod download gave no go.mod"; fi
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$#\1#p' "$kmod" | sort -u)
[ ${#staging[@]} -gt 0 ] || die "k8s.io/kubernetes@$version: no staging replace directives in its go.mod"
# Its go line (a newer Go than ours fails plainly in go build).
gover=$(awk '$1=="go" {print $2; exit}' "$kmod")
[ -n "$gover" ] && "$GO" mod edit -go="$gover"

args=()
for m in "${staging[@]}"; do
	args+=("-replace=$m=$m@$staging_version")
done
"$GO" mod edit "${args[@]}"
"$GO" mod edit -require="k8s.io/kubernetes@$version"

cat >tools.go <<'EOF'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
EOF
"$GO" mod tidy >"$work/tidy.log" 2>&1 || die "go mod tidy failed: $(tail -n3 "$work/tidy.log")"

pkg=k8s.io/component-base/version
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
mkdir -p "$(dirname "$cache")"
tmp="$cache.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldflags" -o "$tmp/kubelet" k8s.io/kubernetes/cmd/kubelet >"$work/build.log" 2>&1; then
	rm -rf "$tmp"
	die "go build failed: $(tail -n5 "$work/build.log")"
fi
echo -n "$version" >"$tmp/VERSION"
"$tmp/kubelet" --version >/dev/null || die "the built kubelet does not run"
rm -rf "$cache"
mv "$tmp" "$cache"
have
