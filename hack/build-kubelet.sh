#!/usr/bin/env bash
# Build the kubelet from the k8s.io/kubernetes module, for the kubelet
# end-to-end test (examples/kubernetes/kubelet_e2e_test.go), and cache the
# binary outside the repository.
#
# `go install k8s.io/kubernetes/cmd/kubelet@vX` refuses: the kubernetes module
# replaces its 33 staging modules (k8s.io/api, k8s.io/client-go, ...) with
# directories of its own tree. A wrapper module, generated in a temp dir
# (hack/k8s-wrapper.sh, shared with hack/build-apiserver.sh), requires
# k8s.io/kubernetes and replaces each staging module with its published
# release (k8s.io/<name> v0.<minor>.<patch>).
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
# shellcheck source=hack/k8s-wrapper.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-wrapper.sh"

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

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
k8s_wrapper_module mpsd.invalid/kubelet-build "$version" k8s.io/kubernetes/cmd/kubelet || die "the wrapper module: see above"
ldflags=$(k8s_ldflags "$version")
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
