#!/usr/bin/env bash
# Build the Go programs the tests use, from the Go module proxy by name and pinned version, and
# keep each in a cache under a key of what it is built from; print one path per name asked for.
#   scripts/build-go.sh NAME...
# NAMEs:
#   manifestcheck  deploy/'s manifests validated as the API server of v1.37.2 validates them
#                  (tests/go/kube/manifestcheck; tests/unit/test_deploy_kubernetes.py)
#   kubelet        k8s.io/kubernetes/cmd/kubelet at the version tests/go/kube/go.mod pins
#   containerd, containerd-shim-runc-v2, ctr
#                  containerd 2 at the version tests/go/containerd/go.mod pins (its own module, so
#                  its dependency versions do not meet the kubelet's)
# The e2e guest's real node (tests/e2e/guest/realnode.py) runs kubelet, containerd, its shim and
# ctr; vm.py copies them into the payload. Each is stamped with its release's version, as the
# release's own build does (the kubelet's /metrics says kubernetes_build_info{git_version=...}).
# The key is a hash of the Go version, the program's build flags, the module's go.mod and go.sum
# (the pinned versions) and the module's own Go files: a new pin or a new Go builds anew, beside the old build.
# Cache: $MEMQOS_GO_CACHE, by default /var/cache/memqos-e2e/go (`make clean` says how to drop it).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build-go: no go command (Go is at /usr/local/go on the project's machines)" >&2; exit 1; }
# The pins are the module's; no toolchain download, no vendor directory, no VCS stamping.
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
cache=${MEMQOS_GO_CACHE:-/var/cache/memqos-e2e/go}

# name -> "module-directory package"
declare -A what=(
  [manifestcheck]="tests/go/kube ./manifestcheck"
  [kubelet]="tests/go/kube k8s.io/kubernetes/cmd/kubelet"
  [containerd]="tests/go/containerd github.com/containerd/containerd/v2/cmd/containerd"
  [containerd-shim-runc-v2]="tests/go/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
  [ctr]="tests/go/containerd github.com/containerd/containerd/v2/cmd/ctr"
)
# The version a release stamps into its binaries, from the module's pin (go.mod).
pin() { awk -v m="$2" '$1 == m {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1/go.mod"; }
ldflags() {
  case $1 in
    kubelet) local v; v=$(pin tests/go/kube k8s.io/kubernetes)
      echo "-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=$(cut -d. -f1 <<<"${v#v}")" \
           "-X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$v") -X k8s.io/component-base/version.gitTreeState=clean" ;;
    containerd|containerd-shim-runc-v2|ctr)
      echo "-s -w -X github.com/containerd/containerd/v2/version.Version=$(pin tests/go/containerd github.com/containerd/containerd/v2)" ;;
    *) echo "-s -w" ;;
  esac
}
tags() { case $1 in containerd) echo "no_btrfs no_devmapper no_zfs" ;; esac; }

[ $# -gt 0 ] || { echo "usage: scripts/build-go.sh NAME... (${!what[*]})" >&2; exit 2; }
for name in "$@"; do
  [ -n "${what[$name]:-}" ] || { echo "build-go: unknown program '$name' (${!what[*]})" >&2; exit 2; }
done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time: sessions and CI jobs on one machine share the cache

for name in "$@"; do
  read -r module package <<<"${what[$name]}"
  key=$( { go version; ldflags "$name"; tags "$name"; cd "$module" && cat go.mod go.sum && find . -name '*.go' -print0 | sort -z | xargs -0r cat; } \
         | sha256sum | cut -c1-16)
  out="$cache/$name-$key/$name"
  if [ ! -x "$out" ]; then
    echo "build-go: building $name ($package in $module, key $key); the first build takes minutes" >&2
    tmp="$cache/.$name-$key.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    start=$SECONDS
    flags=$(ldflags "$name") buildtags=$(tags "$name")
    (cd "$repo/$module" && nice go build -trimpath -tags "$buildtags" -ldflags "$flags" -o "$tmp/$name" "$package")
    mv -T "$tmp" "$cache/$name-$key"
    echo "build-go: built $name in $((SECONDS - start)) s" >&2
  fi
  echo "$out"
done
