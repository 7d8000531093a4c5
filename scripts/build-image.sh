#!/usr/bin/env bash
# Build the DaemonSet's OCI image from our .deb, offline but for the Debian mirror:
#   scripts/build-image.sh [DEB]   -> build/image/memqos-systemd_<version>.oci.tar (path on stdout)
# DEB defaults to build/deb/memqos-systemd_<version>_all.deb (make deb). The root is bookworm's
# `essential` set (no apt: nothing in a running container installs packages) with the .deb and
# its Depends, installed by mmdebstrap from scripts/debian-mirror; umoci (Debian's) makes it an
# OCI image with the entry point `memqos-systemd run --config /etc/memqos-systemd/config.yaml`
# (a ConfigMap is mounted there, deploy/kubernetes/). Docs, man pages, locales, apt lists and
# caches are left out. Reproducible: every time stamp is the changelog's (SOURCE_DATE_EPOCH),
# so the same .deb and the same mirror state give the same sha256.
# MEMQOS_IMAGE_VARIANT=minbase gives a root with apt (for debugging; larger).
# Load it: podman load -i build/image/memqos-systemd_<version>.oci.tar (or skopeo copy
# oci-archive:... docker://REGISTRY/memqos-systemd:<version> to push).
# Needs root (mmdebstrap's root mode), mmdebstrap and umoci: scripts/install-deps.sh image.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "build-image: $*" >&2; }
die() { log "$*"; exit 1; }

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
cd "$repo"
for tool in mmdebstrap umoci dpkg-parsechangelog; do
  command -v "$tool" >/dev/null || die "missing $tool (run: scripts/install-deps.sh image)"
done
[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap installs the root as root)"

version=$(dpkg-parsechangelog -l debian/changelog -S Version)
deb=$(realpath "${1:-build/deb/memqos-systemd_${version}_all.deb}") ||
  die "no .deb at ${1:-build/deb/memqos-systemd_${version}_all.deb} (run: make deb)"
[ -f "$deb" ] || die "no .deb at $deb (run: make deb)"
deb_version=$(dpkg-deb -f "$deb" Version)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(dpkg-parsechangelog -l debian/changelog -S Timestamp)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
variant=${MEMQOS_IMAGE_VARIANT:-essential}
mirror=$("$repo/scripts/debian-mirror")
out=$repo/build/image
name=memqos-systemd_${deb_version}.oci.tar

# Under /tmp itself: the .deb is bind-mounted into the root at the same path, and the hook below
# removes that path's directory from the root again (leaving the root's own /tmp).
work=$(mktemp -d /tmp/memqos-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$deb" "$work/"
export MEMQOS_IMAGE_WORK=$work
start=$(date +%s)

log "mmdebstrap bookworm ($variant) from $mirror with $(basename "$deb")"
# The merged-usr hook: mmdebstrap merges /usr and installs usr-is-merged, not usrmerge (which
# brings perl, 47 MiB; init-system-helpers needs one of the two). No Recommends. path-exclude:
# dpkg never unpacks these (copyright files are kept, as Debian asks). The customize hook, after
# the automount hook has unmounted the .deb, drops what apt and dpkg leave behind that a
# container never reads.
mmdebstrap --quiet --mode=root --variant="$variant" --format=tar \
  --aptopt='APT::Install-Recommends "false"' \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount --include="$work/$(basename "$deb")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old \
      "$1"/var/lib/dpkg/*-old "$1"/var/cache/ldconfig/aux-cache "$1"/var/lib/apt/extended_states \
      "$1"/var/lib/dpkg/lock* "$1"/var/lib/apt/lists/lock "$1"/var/cache/apt/archives/lock \
      "$1"/usr/share/info/dir "$1"/var/log/* "$1"/etc/machine-id "$1"/var/lib/dbus/machine-id "$1$MEMQOS_IMAGE_WORK"' \
  bookworm "$work/rootfs.tar" "$mirror" >&2

log "umoci: OCI image"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:$deb_version"
umoci raw add-layer --image "$work/oci:$deb_version" \
  --history.created="$created" --history.created_by="scripts/build-image.sh $(basename "$deb")" \
  "$work/rootfs.tar"
umoci config --image "$work/oci:$deb_version" --created="$created" --author="memqos-systemd" \
  --history.created="$created" --history.created_by="scripts/build-image.sh: entry point" \
  --config.entrypoint=/usr/bin/memqos-systemd --config.entrypoint=run \
  --config.entrypoint=--config --config.entrypoint=/etc/memqos-systemd/config.yaml \
  --config.env=PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label=org.opencontainers.image.title=memqos-systemd \
  --config.label=org.opencontainers.image.version="$deb_version" \
  --config.label=org.opencontainers.image.created="$created" \
  --config.label=org.opencontainers.image.source=debian/memqos-systemd_"$deb_version" \
  --config.workingdir=/
umoci gc --layout "$work/oci"

# One file (podman load's oci-archive), written with the same time stamp, order and owner every time.
mkdir -p "$out"
tar --create --file="$work/$name" --directory="$work/oci" --sort=name --mtime="@$SOURCE_DATE_EPOCH" \
  --owner=0 --group=0 --numeric-owner --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime .
mv "$work/$name" "$out/$name"
size=$(du -k --apparent-size "$out/$name" | cut -f1)
unpacked=$(du -k --apparent-size "$work/rootfs.tar" | cut -f1)
log "built build/image/$name: $((size / 1024)) MiB (unpacked root $((unpacked / 1024)) MiB)," \
  "sha256 $(sha256sum "$out/$name" | cut -c1-16), in $(( $(date +%s) - start )) s"
echo "$out/$name"
