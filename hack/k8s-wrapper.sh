# shellcheck shell=bash
# Sourced by hack/build-kubelet.sh and hack/build-apiserver.sh: the wrapper
# module that builds commands of the k8s.io/kubernetes module.
#
# `go install k8s.io/kubernetes/cmd/<name>@vX` refuses: the kubernetes
# module replaces its 33 staging modules (k8s.io/api, k8s.io/client-go, ...)
# with directories of its own tree. `k8s_wrapper_module NAME VERSION PKG...`,
# run in an empty directory, makes it a module NAME requiring
# k8s.io/kubernetes at VERSION and replacing each staging module with its
# published release (k8s.io/<name> v0.<minor>.<patch>), with a tools.go
# importing each PKG.
# Needs GO; on failure it prints the reason on stderr and returns 1.
# k8s_ldflags VERSION prints the -ldflags that stamp the version.

k8s_wrapper_module() {
	local name=$1 version=$2
	shift 2
	# v1.37.2 -> v0.37.2: the staging modules' tags.
	local staging_version="v0.${version#v1.}"
	"$GO" mod init "$name" >/dev/null 2>&1 || { echo "go mod init failed" >&2; return 1; }

	# The kubernetes module's own go.mod names its staging replacements.
	local kmod
	kmod=$("$GO" mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	if [ -z "$kmod" ] || [ ! -r "$kmod" ]; then
		echo "k8s.io/kubernetes@$version: go mod download gave no go.mod" >&2
		return 1
	fi
	local staging
	mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$#\1#p' "$kmod" | sort -u)
	if [ ${#staging[@]} -eq 0 ]; then
		echo "k8s.io/kubernetes@$version: no staging replace directives in its go.mod" >&2
		return 1
	fi
	# Its go line (a newer Go than ours fails plainly in go build).
	local gover
	gover=$(awk '$1=="go" {print $2; exit}' "$kmod")
	if [ -n "$gover" ]; then "$GO" mod edit -go="$gover" || return 1; fi

	local args=() m
	for m in "${staging[@]}"; do
		args+=("-replace=$m=$m@$staging_version")
	done
	"$GO" mod edit "${args[@]}" -require="k8s.io/kubernetes@$version" || return 1

	{
		printf '//go:build tools\n\npackage tools\n\n'
		for m in "$@"; do
			printf 'import _ "%s"\n' "$m"
		done
	} >tools.go || return 1
	if ! "$GO" mod tidy >tidy.log 2>&1; then
		echo "go mod tidy failed: $(tail -n3 tidy.log)" >&2
		return 1
	fi
}

k8s_ldflags() {
	local version=$1 pkg=k8s.io/component-base/version minor
	minor=${version#v1.}
	minor=${minor%%.*}
	echo "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
}
