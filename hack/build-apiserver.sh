#!/usr/bin/env bash
# Build kube-apiserver (from the k8s.io/kubernetes module, as
# hack/build-kubelet.sh builds the kubelet: the same wrapper module, so the
# packages both use come from the Go build cache) and etcd (from
# go.etcd.io/etcd/server/v3) for the admission policy test on a real API
# server (examples/kubernetes/policy_apiserver_test.go), and cache both
# binaries outside the repository.
#
# `go install go.etcd.io/etcd/server/v3@vX` refuses (its go.mod has replace
# directives); a wrapper module requiring it builds it.
#
# Usage: hack/build-apiserver.sh [KUBERNETES_VERSION [ETCD_VERSION]]
#   (defaults: v1.37.2, the kubelet's; v3.7.4)
# Result: $MPSD_APISERVER_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/apiserver)
#   <cache>/kube-apiserver  static binary (CGO_ENABLED=0)
#   <cache>/etcd            static binary (CGO_ENABLED=0)
#   <cache>/VERSION         "<kubernetes version> <etcd version>"
# Prints one line: "<kubernetes version> <etcd version> <cache>".
# Idempotent: a cache holding those versions is kept as is. After the
# kubelet's build, about 500 more CPU-seconds (5-10 min on 2 cores) and
# 2.4 GiB of memory; the Go build cache makes a rebuild take 20 s.
# Exits 0 when both are available, 1 otherwise (with the reason on stderr).
set -euo pipefail
# shellcheck source=hack/k8s-wrapper.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-wrapper.sh"

# CI may run without HOME; take it from the user database then.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/apiserver}
version=${1:-v1.37.2}
etcd_version=${2:-v3.7.4}
GO=${GO:-go}

die() { echo "build-apiserver: $*" >&2; exit 1; }

have() {
	[ -x "$cache/kube-apiserver" ] && [ -x "$cache/etcd" ] &&
		[ "$(cat "$cache/VERSION" 2>/dev/null)" = "$version $etcd_version" ] || return 1
	echo "$version $etcd_version $cache"
}

case "$version" in
v1.*.*) ;;
*) die "version $version: want v1.<minor>.<patch>" ;;
esac
case "$etcd_version" in
v3.*.*) ;;
*) die "etcd version $etcd_version: want v3.<minor>.<patch>" ;;
esac
have && exit 0
command -v "$GO" >/dev/null || die "go not found"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$cache")"
tmp="$cache.tmp"
rm -rf "$tmp"
mkdir -p "$tmp" "$work/kubernetes" "$work/etcd"

cd "$work/kubernetes"
k8s_wrapper_module mpsd.invalid/kubelet-build "$version" k8s.io/kubernetes/cmd/kube-apiserver || die "the wrapper module: see above"
if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$(k8s_ldflags "$version")" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >build.log 2>&1; then
	rm -rf "$tmp"
	die "go build kube-apiserver failed: $(tail -n5 build.log)"
fi

cd "$work/etcd"
"$GO" mod init mpsd.invalid/etcd-build >/dev/null 2>&1 || die "go mod init failed"
"$GO" mod edit -require="go.etcd.io/etcd/server/v3@$etcd_version"
printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
"$GO" mod tidy >tidy.log 2>&1 || die "go mod tidy (etcd) failed: $(tail -n3 tidy.log)"
if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 >build.log 2>&1; then
	rm -rf "$tmp"
	die "go build etcd failed: $(tail -n5 build.log)"
fi

echo -n "$version $etcd_version" >"$tmp/VERSION"
"$tmp/kube-apiserver" --version >/dev/null || die "the built kube-apiserver does not run"
"$tmp/etcd" --version >/dev/null || die "the built etcd does not run"
rm -rf "$cache"
mv "$tmp" "$cache"
have
