#!/bin/bash
# Smoke test of the guest itself and of the harness helpers: real systemd as PID 1, cgroup v2
# with memory_recursiveprot, SetUnitProperties reaching memory.min, and kubelet/containerd-like
# transient units landing in the cgroup paths the daemon will look at.
# e2e-timeout: 180
set -euo pipefail
. "$MEMQOS_E2E_GUEST/lib.sh"
pause_memqos  # these checks are of systemd itself, not of the daemon

CG=/sys/fs/cgroup

check_eq "PID 1 is systemd" "$(cat /proc/1/comm)" systemd
check_eq "/sys/fs/cgroup is cgroup2" "$(stat -fc %T $CG)" cgroup2fs
check "memory controller available" grep -qw memory $CG/cgroup.controllers
opts=$(awk '$2 == "/sys/fs/cgroup" {print $4}' /proc/self/mounts)
check "cgroup2 mounted with memory_recursiveprot ($opts)" grep -qw memory_recursiveprot <<<"${opts//,/ }"
# `systemd 252 (252.x-y)`: the version itself in the CHECK line, and that it is one we support.
sd_version=$(systemctl --version | awk 'NR==1 && $1 == "systemd" {print $2}')
check "systemd version ${sd_version:-unknown} >= 240 (MemoryMin=)" test "${sd_version:-0}" -ge 240

# SetUnitProperties over D-Bus, exactly as a client would call it.
busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
  org.freedesktop.systemd1.Manager SetUnitProperties 'sba(sv)' kubepods.slice true 1 \
  MemoryMin t 104857600
check_file_eq $CG/kubepods.slice/memory.min 104857600 "kubepods.slice memory.min after SetUnitProperties"
check "runtime drop-in written" test -d /run/systemd/system.control/kubepods.slice.d

# A Burstable pod slice and a containerd-like scope, created with StartTransientUnit.
uid=$(cat /proc/sys/kernel/random/uuid)
pod=$(e2e pod-create --uid "$uid" --qos burstable)
check_eq "pod slice name" "$pod" "kubepods-burstable-pod${uid//-/_}.slice"
pod_cg=$(e2e cgroup "$pod")
check_eq "pod slice cgroup" "$pod_cg" "$CG/kubepods.slice/kubepods-burstable.slice/$pod"
check "pod cgroup directory exists" test -d "$pod_cg"

cid=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
scope=$(e2e container-create "$pod" --id "$cid")
check_eq "container scope name" "$scope" "cri-containerd-$cid.scope"
scope_cg=$(e2e cgroup "$scope")
check_eq "container scope cgroup" "$scope_cg" "$pod_cg/$scope"
pid=$(head -1 "$scope_cg/cgroup.procs")
check_eq "scope runs sleep" "$(cat /proc/$pid/comm 2>/dev/null)" sleep
check_eq "scope is delegated" "$(systemctl show -P Delegate "$scope")" yes

# Guaranteed and BestEffort placement.
g=$(e2e pod-create --uid "$(cat /proc/sys/kernel/random/uuid)" --qos guaranteed)
check_eq "guaranteed pod cgroup" "$(e2e cgroup "$g")" "$CG/kubepods.slice/$g"
b=$(e2e pod-create --uid "$(cat /proc/sys/kernel/random/uuid)" --qos besteffort)
check_eq "besteffort pod cgroup" "$(e2e cgroup "$b")" "$CG/kubepods.slice/kubepods-besteffort.slice/$b"

# Protection on the pod slice through the helper (SetUnitProperties, runtime).
e2e set-property "$pod" MemoryLow=52428800 MemoryHigh=419430400
check_eq "pod memory.low" "$(e2e memory "$pod" low)" 52428800
check_eq "pod memory.high" "$(e2e memory "$pod" high)" 419430400
check_eq "scope memory.high unset" "$(e2e memory "$scope" high)" 18446744073709551615

# Deleting: the cgroups go away.
e2e container-delete "$scope"
check "scope cgroup removed" wait_until 10 test ! -d "$scope_cg"
e2e pod-delete "$pod"
check "pod cgroup removed" wait_until 10 test ! -d "$pod_cg"
e2e pod-delete "$g"
e2e pod-delete "$b"
