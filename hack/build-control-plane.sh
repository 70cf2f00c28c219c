#!/usr/bin/env bash
# Build the rest of a one-node Kubernetes control plane for the control-plane
# end-to-end test (examples/kubernetes/controlplane_e2e_test.go), beside the
# kubelet (hack/build-kubelet.sh) and kube-apiserver and etcd
# (hack/build-apiserver.sh), and cache the binaries outside the repository:
#   - kube-scheduler and kube-controller-manager from the k8s.io/kubernetes
#     module, through the same wrapper module (hack/k8s-wrapper.sh), so the
#     packages they share with the kubelet come from the Go build cache;
#   - containerd 1.7 (containerd and containerd-shim-runc-v2) from the
#     github.com/containerd/containerd module. The 1.37 kubelet hands DRA
#     devices to the runtime only as CRI CDI devices, which Debian's
#     containerd 1.6 ignores; 1.7 with enable_cdi applies them, with Debian's
#     runc. `go install` refuses the module (its go.mod has an exclude
#     directive); a wrapper module repeating its excludes builds it.
#
# Usage: hack/build-control-plane.sh [KUBERNETES_VERSION [CONTAINERD_VERSION]]
#   (defaults: v1.37.2, the kubelet's; v1.7.35)
# Result: $MPSD_CONTROLPLANE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/controlplane)
#   <cache>/kube-scheduler             static binary (CGO_ENABLED=0)
#   <cache>/kube-controller-manager    static binary (CGO_ENABLED=0)
#   <cache>/containerd                 static binary (CGO_ENABLED=0: no btrfs snapshotter)
#   <cache>/containerd-shim-runc-v2    static binary (CGO_ENABLED=0)
#   <cache>/VERSION                    "<kubernetes version> <containerd version>"
# Prints one line: "<kubernetes version> <containerd version> <cache>".
# Idempotent: a cache holding those versions is kept as is. After the
# kubelet's and kube-apiserver's builds, about 3 minutes of wall time on 2
# cores (150 CPU-seconds) and 2.6 GiB of memory; the Go build cache makes a
# rebuild take about 30 s.
# Exits 0 when all four are available, 1 otherwise (with the reason on stderr).
set -euo pipefail
# shellcheck source=hack/k8s-wrapper.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-wrapper.sh"

# CI may run without HOME; take it from the user database then.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache=${MPSD_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/controlplane}
version=${1:-v1.37.2}
containerd_version=${2:-v1.7.35}
GO=${GO:-go}

die() { echo "build-control-plane: $*" >&2; exit 1; }

have() {
	local b
	for b in kube-scheduler kube-controller-manager containerd containerd-shim-runc-v2; do
		[ -x "$cache/$b" ] || return 1
	done
	[ "$(cat "$cache/VERSION" 2>/dev/null)" = "$version $containerd_version" ] || return 1
	echo "$version $containerd_version $cache"
}

case "$version" in
v1.*.*) ;;
*) die "version $version: want v1.<minor>.<patch>" ;;
esac
case "$containerd_version" in
v1.7.*) ;;
*) die "containerd version $containerd_version: want v1.7.<patch> (2.x is not tried with Debian's runc)" ;;
esac
have && exit 0
command -v "$GO" >/dev/null || die "go not found"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$cache")"
tmp="$cache.tmp"
rm -rf "$tmp"
mkdir -p "$tmp" "$work/kubernetes" "$work/containerd"

cd "$work/kubernetes"
k8s_wrapper_module mpsd.invalid/kubelet-build "$version" \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager ||
	die "the wrapper module: see above"
for cmd in kube-scheduler kube-controller-manager; do
	if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$(k8s_ldflags "$version")" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd" >build.log 2>&1; then
		rm -rf "$tmp"
		die "go build $cmd failed: $(tail -n5 build.log)"
	fi
done

cd "$work/containerd"
"$GO" mod init mpsd.invalid/containerd-build >/dev/null 2>&1 || die "go mod init failed"
cmod=$("$GO" mod download -json "github.com/containerd/containerd@$containerd_version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$cmod" ] || [ ! -r "$cmod" ]; then
	die "github.com/containerd/containerd@$containerd_version: go mod download gave no go.mod"
fi
# Its go line, and its excludes: they apply only in the main module.
gover=$(awk '$1=="go" {print $2; exit}' "$cmod")
[ -z "$gover" ] || "$GO" mod edit -go="$gover"
args=()
while read -r ex; do
	args+=("-exclude=$ex")
done < <(awk '$1=="exclude" && $2!="(" {print $2 "@" $3}' "$cmod")
"$GO" mod edit "${args[@]}" -require="github.com/containerd/containerd@$containerd_version"
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/cmd/containerd"\n\t_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"\n)\n' >tools.go
"$GO" mod tidy >tidy.log 2>&1 || die "go mod tidy (containerd) failed: $(tail -n3 tidy.log)"
cldflags="-s -w -X github.com/containerd/containerd/version.Version=$containerd_version"
for cmd in containerd containerd-shim-runc-v2; do
	if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$cldflags" -o "$tmp/$cmd" "github.com/containerd/containerd/cmd/$cmd" >build.log 2>&1; then
		rm -rf "$tmp"
		die "go build $cmd failed: $(tail -n5 build.log)"
	fi
done

echo -n "$version $containerd_version" >"$tmp/VERSION"
"$tmp/kube-scheduler" --version >/dev/null || die "the built kube-scheduler does not run"
"$tmp/kube-controller-manager" --version >/dev/null || die "the built kube-controller-manager does not run"
"$tmp/containerd" --version >/dev/null || die "the built containerd does not run"
"$tmp/containerd-shim-runc-v2" -v >/dev/null || die "the built containerd-shim-runc-v2 does not run"
rm -rf "$cache"
mv "$tmp" "$cache"
have
