#!/usr/bin/env bash
# Build the Go programs the tests use, from the Go module proxy by name and pinned version, and
# keep each in a cache under a key of what it is built from; print one path per name asked for.
#   scripts/build-go.sh NAME...
# NAMEs:
#   manifestcheck  deploy/'s manifests validated as the API server of v1.37.2 validates them
#                  (tests/go/kube/manifestcheck; tests/unit/test_deploy_kubernetes.py)
#   kubelet        k8s.io/kubernetes/cmd/kubelet at the version tests/go/kube/go.mod pins
# The key is a hash of the Go version, the module's go.mod and go.sum (the pinned versions) and
# the module's own Go files: a new pin or a new Go builds anew, beside the old build.
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
)

[ $# -gt 0 ] || { echo "usage: scripts/build-go.sh NAME... (${!what[*]})" >&2; exit 2; }
for name in "$@"; do
  [ -n "${what[$name]:-}" ] || { echo "build-go: unknown program '$name' (${!what[*]})" >&2; exit 2; }
done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time: sessions and CI jobs on one machine share the cache

for name in "$@"; do
  read -r module package <<<"${what[$name]}"
  key=$( { go version; cd "$module" && cat go.mod go.sum && find . -name '*.go' -print0 | sort -z | xargs -0r cat; } \
         | sha256sum | cut -c1-16)
  out="$cache/$name-$key/$name"
  if [ ! -x "$out" ]; then
    echo "build-go: building $name ($package in $module, key $key); the first build takes minutes" >&2
    tmp="$cache/.$name-$key.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    start=$SECONDS
    (cd "$repo/$module" && nice go build -trimpath -o "$tmp/$name" "$package")
    mv -T "$tmp" "$cache/$name-$key"
    echo "build-go: built $name in $((SECONDS - start)) s" >&2
  fi
  echo "$out"
done
