#!/usr/bin/env bash
# Build the Debian package from the files git tracks, and nothing else:
#   scripts/build-deb.sh            -> build/deb/memqos-systemd_<version>_all.deb
# The tracked files (as they are in the work tree; untracked and ignored files never
# enter the package) are copied to a temporary directory and built there with
# `dpkg-buildpackage -us -uc -b`, so the work tree gets no build debris. DEB_BUILD_OPTIONS
# is taken from the environment (DEB_BUILD_OPTIONS=nocheck skips the build-time tests and
# the build profile of the same name, so their Build-Depends are not needed). Then lintian
# checks the package and the source: errors fail the build, warnings are printed.
# Needs: scripts/install-deps.sh deb.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$repo/build/deb
log() { echo "build-deb: $*" >&2; }
die() { log "$*"; exit 1; }

# Debian's tools and Debian's python3 only: a pyenv, a venv or /usr/local first on PATH would
# otherwise build (and test) against another Python and other libraries than the .deb uses.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset VIRTUAL_ENV PYTHONHOME PYTHONPATH PYTHONSTARTUP PYTHONUSERBASE PYENV_VERSION

cd "$repo"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "$repo is not a git work tree"
for tool in dpkg-buildpackage dpkg-parsechangelog dpkg-source lintian; do
  command -v "$tool" >/dev/null || die "missing $tool (run: scripts/install-deps.sh deb)"
done

# One version, written in three places: the changelog decides the .deb's name.
version=$(dpkg-parsechangelog -l debian/changelog -S Version)
py_version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml | head -n1)
mod_version=$(sed -n 's/^__version__ *= *"\(.*\)"/\1/p' memqos_systemd/__init__.py)
[ "$version" = "$py_version" ] && [ "$version" = "$mod_version" ] ||
  die "versions differ: debian/changelog $version, pyproject.toml $py_version, memqos_systemd/__init__.py $mod_version"

changed=$(git status --porcelain --untracked-files=no)
[ -z "$changed" ] || log "building tracked files with uncommitted changes:"$'\n'"$changed"

work=$(mktemp -d "${TMPDIR:-/tmp}/memqos-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The tree is built (and its tests run) at least BUILD_PATH_MIN characters deep, as on a buildd
# or under reprotest, whose build paths are long: a test that depends on where the tree lives
# fails here, in `make deb` and `make test`, not first on a packager's machine.
BUILD_PATH_MIN=150
name=memqos-systemd-$version
build=$work
pad=$((BUILD_PATH_MIN - ${#work} - ${#name} - 2))
if [ "$pad" -gt 0 ]; then
  build=$work/$(printf '%*s' "$pad" '' | tr ' ' _)
  mkdir "$build"
fi
src=$build/$name
mkdir "$src"
# Tracked files that exist in the work tree (a deleted tracked file is simply left out).
git ls-files -z --cached | while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
done | tar --create --no-recursion --null --files-from=- | tar --extract --directory="$src"
chmod +x "$src/debian/rules"

if [[ " ${DEB_BUILD_OPTIONS:-} " == *" nocheck "* ]] && [ -z "${DEB_BUILD_PROFILES:-}" ]; then
  export DEB_BUILD_PROFILES=nocheck
fi
log "building $version (DEB_BUILD_OPTIONS='${DEB_BUILD_OPTIONS:-}' DEB_BUILD_PROFILES='${DEB_BUILD_PROFILES:-}')"

# The source package too, only so lintian can check debian/ as a source package.
(cd "$build" && dpkg-source --build "$name" >/dev/null)
(cd "$src" && dpkg-buildpackage -us -uc -b)

deb=$build/memqos-systemd_${version}_all.deb
changes=$(ls "$build"/memqos-systemd_"${version}"_*.changes)
[ -f "$deb" ] || die "dpkg-buildpackage made no $deb"

log "lintian (errors fail the build):"
status=0
lintian --fail-on error --display-level '>=warning' \
  "$changes" "$build/memqos-systemd_${version}.dsc" || status=$?
[ "$status" = 0 ] || die "lintian found errors (exit $status)"

mkdir -p "$out"
rm -f "$out"/memqos-systemd_*.deb
cp "$deb" "$out/"
log "built build/deb/$(basename "$deb")"
