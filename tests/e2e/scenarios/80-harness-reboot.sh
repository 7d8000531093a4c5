#!/bin/bash
# Reboot support of the harness: `e2e reboot` restarts the guest and this script runs again with
# MEMQOS_E2E_BOOT=2. Files on the root disk survive, runtime unit properties do not (systemd
# keeps them in /run), and an enabled kubelet.service (e2e kubelet enable) comes back at boot.
# e2e-timeout: 240
set -euo pipefail
. "$MEMQOS_E2E_GUEST/lib.sh"
pause_memqos  # it would set kubepods.slice itself

marker=/var/lib/memqos-e2e-reboot-marker
case $MEMQOS_E2E_BOOT in
  1)
    e2e set-property kubepods.slice MemoryLow=209715200
    check_file_eq /sys/fs/cgroup/kubepods.slice/memory.low 209715200 "memory.low before reboot"
    e2e pod-json web --container app:100Mi:200Mi | jq -s . | e2e pods-write -
    e2e kubelet enable
    check_eq "kubelet.service enabled" "$(systemctl is-enabled kubelet.service)" enabled
    cat /proc/sys/kernel/random/boot_id > "$marker"
    sync
    e2e reboot
    ;;
  2)
    check "root disk kept the marker" test -s "$marker"
    check "a new boot" test "$(cat /proc/sys/kernel/random/boot_id)" != "$(cat "$marker" 2>/dev/null)"
    check "runtime drop-in gone after reboot" test ! -e /run/systemd/system.control/kubepods.slice.d
    low=$(cat /sys/fs/cgroup/kubepods.slice/memory.low 2>/dev/null || echo absent)
    check "kubepods.slice memory.low not kept ($low)" test "$low" = 0 -o "$low" = absent
    check "enabled kubelet.service came back at boot" wait_until 30 systemctl is-active -q kubelet.service
    served=$(python3 -c 'import memqos_e2e as e; print(e.kubelet_get_pods()["items"][0]["metadata"]["name"])')
    check_eq "kubelet serves the pods written before the reboot" "$served" web
    e2e kubelet disable
    rm -f "$marker"
    ;;
esac
