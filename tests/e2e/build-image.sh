#!/bin/bash
# Build (or reuse) the cached Debian bookworm guest for the e2e harness and print its directory.
#
#   tests/e2e/build-image.sh            build if needed, print the cache directory on stdout
#   tests/e2e/build-image.sh --key      print the cache key only
#   tests/e2e/build-image.sh --force    rebuild even if a cached image exists
#
# Output directory ${MEMQOS_E2E_CACHE:-/var/cache/memqos-e2e}/<key>/ holds vmlinuz, initrd.img,
# root.img (raw ext4, made with mkfs.ext4 -d, no loop mounts) and image.json. <key> hashes this
# script and everything in image/, so editing the package list or the boot stub rebuilds.
# The build happens in a temporary directory that is renamed into place only when complete, so an
# interrupted build is never reused. Needs root (debootstrap, chroot), debootstrap and e2fsprogs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${MEMQOS_E2E_CACHE:-/var/cache/memqos-e2e}
suite=bookworm
root_size=${MEMQOS_E2E_ROOT_SIZE:-4G}

log() { echo "build-image: $*" >&2; }

mirror=${MEMQOS_E2E_MIRROR:-$("$here/../../scripts/debian-mirror")}
security_mirror=${MEMQOS_E2E_SECURITY_MIRROR:-${mirror%/debian}/debian-security}

compute_key() {
  (
    cd "$here"
    for f in build-image.sh $(find image -type f | LC_ALL=C sort); do
      printf '== %s\n' "$f"
      cat "$f"
    done
    # The mirror and suite do not change the recipe, but a different suite is a different image.
    printf '== suite %s\n' "$suite"
  ) | sha256sum | cut -c1-16
}

key=$(compute_key)
force=0
case ${1:-} in
  --key) echo "$key"; exit 0 ;;
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--key|--force]" >&2; exit 2 ;;
esac

out=$cache/$key
if [ "$force" = 0 ] && [ -f "$out/image.json" ]; then
  echo "$out"
  exit 0
fi

[ "$(id -u)" = 0 ] || { log "must run as root (debootstrap, chroot)"; exit 1; }
for tool in debootstrap mkfs.ext4 chroot flock; do
  command -v "$tool" >/dev/null || { log "missing $tool"; exit 1; }
done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# True if anything is mounted at or below $1.
has_mounts_below() {
  local d
  d=$(realpath -m "$1")
  awk -v d="$d" '$5 == d || index($5, d "/") == 1 {found=1} END {exit !found}' /proc/self/mountinfo
}

unmount_below() {
  local d m
  d=$(realpath -m "$1")
  # Deepest first.
  for m in $(awk -v d="$d" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}

safe_remove() {
  # Never rm -rf a tree that still has /dev, /proc or /sys bind-mounted inside it.
  local d=$1
  [ -e "$d" ] || return 0
  unmount_below "$d"
  if has_mounts_below "$d"; then
    log "leaving $d in place: something is still mounted below it"
    return 1
  fi
  rm -rf --one-file-system "$d"
}

# Leftovers of interrupted builds (we hold the lock, so nobody else is building).
for stale in "$cache"/.build-*; do
  [ -e "$stale" ] || continue
  log "removing leftover $stale"
  safe_remove "$stale" || true
done

# Another process may have finished the same image while we waited for the lock.
if [ "$force" = 0 ] && [ -f "$out/image.json" ]; then
  echo "$out"
  exit 0
fi

start=$(date +%s)
tmp=$cache/.build-$key.$$
rootfs=$tmp/root
mkdir -p "$tmp"
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  unmount_below "$rootfs"
  safe_remove "$tmp" || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

packages=$(grep -v '^[[:space:]]*#' "$here/image/packages.txt" | awk 'NF {print $1}' | paste -sd, -)
log "debootstrap $suite from $mirror: $packages"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2

mount_chroot() {
  mount -t proc proc "$rootfs/proc"
  mount -t sysfs sysfs "$rootfs/sys"
  mount --bind /dev "$rootfs/dev"
  mount --bind /dev/pts "$rootfs/dev/pts"
}
in_chroot() {
  LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive chroot "$rootfs" "$@"
}

# No service starts inside the chroot while packages install.
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod +x "$rootfs/usr/sbin/policy-rc.d"
cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf" 2>/dev/null || true

mount_chroot
log "installing the kernel"
in_chroot apt-get update >&2
in_chroot apt-get -y --no-install-recommends install initramfs-tools >&2
# A small initramfs boots faster under TCG: only what is needed to mount an ext4 root on virtio.
cat > "$rootfs/etc/initramfs-tools/conf.d/memqos-e2e" <<'EOF'
MODULES=list
EOF
cat >> "$rootfs/etc/initramfs-tools/modules" <<'EOF'
virtio_pci
virtio_blk
ext4
crc32c_generic
EOF
in_chroot apt-get -y --no-install-recommends install linux-image-amd64 >&2
# Upgrade what debootstrap took from the release to the current point/security versions.
in_chroot apt-get -y --no-install-recommends upgrade >&2
in_chroot dpkg-query -W -f '${Package}\t${Version}\n' > "$tmp/packages.tsv"
in_chroot apt-get clean
unmount_below "$rootfs"
has_mounts_below "$rootfs" && { log "chroot mounts did not go away"; exit 1; }

log "configuring the guest"
rm -f "$rootfs/usr/sbin/policy-rc.d"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/cache/apt/*.bin
mkdir -p "$rootfs/var/lib/apt/lists/partial"
echo memqos-e2e > "$rootfs/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 memqos-e2e\n::1 localhost\n' > "$rootfs/etc/hosts"
: > "$rootfs/etc/resolv.conf"
# Fresh overlay every run, so no fsck; a fixed machine id avoids first-boot work.
echo '/dev/vda / ext4 rw,errors=remount-ro 0 0' > "$rootfs/etc/fstab"
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$rootfs/etc/machine-id"
echo >> "$rootfs/etc/machine-id"
# Empty root password: only for poking at a hung guest by hand (serial getty is masked anyway).
sed -i 's/^root:[^:]*:/root::/' "$rootfs/etc/shadow"

sd=$rootfs/etc/systemd/system
for unit in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
  apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
  fstrim.timer systemd-timesyncd.service prometheus.service; do
  ln -sf /dev/null "$sd/$unit"
done
# Drivers for emulated hardware nothing uses; each costs boot time under TCG.
printf 'blacklist %s\n' floppy kvm kvm_intel kvm_amd pcspkr psmouse serio_raw ata_piix \
  ata_generic i2c_piix4 > "$rootfs/etc/modprobe.d/memqos-e2e.conf"
mkdir -p "$rootfs/etc/systemd/system.conf.d" "$rootfs/etc/systemd/journald.conf.d"
cat > "$rootfs/etc/systemd/system.conf.d/memqos-e2e.conf" <<'EOF'
[Manager]
DefaultTimeoutStopSec=15s
EOF
cat > "$rootfs/etc/systemd/journald.conf.d/memqos-e2e.conf" <<'EOF'
[Journal]
Storage=volatile
EOF
install -m 0755 "$here/image/memqos-e2e-boot" "$rootfs/usr/local/sbin/memqos-e2e-boot"
install -m 0644 "$here/image/memqos-e2e.service" "$sd/memqos-e2e.service"
mkdir -p "$sd/multi-user.target.wants"
ln -sf /etc/systemd/system/memqos-e2e.service "$sd/multi-user.target.wants/memqos-e2e.service"

kver=$(basename "$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -1)")
kver=${kver#vmlinuz-}
cp "$rootfs/boot/vmlinuz-$kver" "$tmp/vmlinuz"
cp "$rootfs/boot/initrd.img-$kver" "$tmp/initrd.img"

log "making root.img ($root_size, ext4 from the tree)"
mkfs.ext4 -q -F -L memqos-root -d "$rootfs" "$tmp/root.img" "$root_size" >&2
used_kib=$(du -sk "$rootfs" | cut -f1)
rm -rf --one-file-system "$rootfs"

end=$(date +%s)
python3 - "$tmp/image.json" "$key" "$kver" "$mirror" "$((end - start))" "$used_kib" \
  "$tmp/packages.tsv" <<'EOF'
import json, sys, time
path, key, kver, mirror, secs, used_kib, pkgs = sys.argv[1:]
packages = dict(line.split("\t", 1) for line in open(pkgs).read().splitlines() if "\t" in line)
json.dump({"key": key, "suite": "bookworm", "kernel": kver, "mirror": mirror,
           "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "build_seconds": int(secs), "rootfs_kib": int(used_kib),
           "packages": packages}, open(path, "w"), indent=1, sort_keys=True)
EOF
rm -f "$tmp/packages.tsv"

if [ -e "$out" ]; then
  safe_remove "$out"
fi
mv "$tmp" "$out"
log "built $out in $((end - start)) s (kernel $kver)"
# Keep the cache bounded (~0.75 GiB an image): this image plus the two newest others (other
# checkouts may still use those).
others=$(ls -1dt "$cache"/*/ 2>/dev/null | sed 's:/$::' | grep -vxF "$out" || true)
for old in $(printf '%s\n' "$others" | tail -n +3); do
  [ -f "$old/image.json" ] || continue
  log "pruning old image $old"
  safe_remove "$old" || true
done
echo "$out"
