#!/usr/bin/python3
"""The resync timer trusts a cgroup that shows the cached values (470926e), on real systemd.

resyncInterval 1s: a light timer resync (node, QoS, reserved slices) every second, a full one
(every unit) every 15th time. Of the units a timer resync lists, the daemon reads over D-Bus
(GetAll) only those whose cgroup's memory.min/low/high differ from its cache (page-rounded,
"max" as 2^64-1); a pod slice cached from its own cgroup at UnitNew is read once at the next
full timer resync. Timer resyncs are counted by the daemon's ListUnitsByPatterns calls (one
each while nothing else happens), D-Bus calls by memqos_dbus_calls_total.
  steady   G + two B (requests of 100M and 10000k: not page multiples, so systemd holds values
           the kernel rounds down) + BE, each with container scopes, and kube.slice/system.slice
           reserved: after one full cycle (the new pod slices' one read), 16 more timer resyncs
           send no GetAll and no SetUnitProperties; every unit's kernel values are systemd's
           own, page-rounded
  systemd  `systemctl set-property --runtime <pod slice> MemoryLow=...`: put back at the next
           full timer resync; GetAll and SetUnitProperties counted
  qos      the same on kubepods-burstable.slice: put back at once (the daemon's inotify watch on
           its memory files), or by the next light resync
  kernel   a value written straight into a pod slice's memory.low (issue 29): the next full
           resync reads the unit over D-Bus, finds systemd still holding the planned value and the
           kernel less, and sets the same value again (GetAll +1, SetUnitProperties +1): systemd
           re-writes the file; then 16 timer resyncs read and write nothing"""
# e2e-timeout: 480
import os
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
PAGE = PAGE_SIZE
KEYS = (("min", "MemoryMin"), ("low", "MemoryLow"), ("high", "MemoryHigh"))

start_empty_node(sample_config(resyncInterval="1s"),
                 "config: TieredReservation, effective, reserved slices, pollInterval 1s, resyncInterval 1s")
start_reserved_slices()

g = make_pod("db", [{"name": "postgres", "requests": {"memory": "96Mi", "cpu": "100m"},
                     "limits": {"memory": "96Mi", "cpu": "100m"}}])
web = make_pod("web", [{"name": "app", "requests": {"memory": "100M"}, "limits": {"memory": "300M"}},
                       {"name": "sidecar", "requests": {"memory": "10000k"}}])
api = make_pod("api", [{"name": "app", "requests": {"memory": "48Mi"}, "limits": {"memory": "160Mi"}}])
be = make_pod("batch", [{"name": "job"}])
pods = [g, web, api, be]
write_pods(pods)  # listed first, then created, as the kubelet does
check(wait_for(lambda: metric("memqos_pods") == len(pods), 20, 0.2), f"the daemon lists the {len(pods)} pods")
units = {p["metadata"]["name"]: start_pod(p) for p in pods}


def rounded(v):
    return v if v == UINT64_MAX else v // PAGE * PAGE


plan = plan_expected(memqos_plan())
expected = {u: {k: rounded(v) for k, v in vals.items()} for u, vals in plan.items()}
bad, took = wait_kernel(expected, 60)
check(not bad, f"{len(expected)} units: kernel = plan (page-rounded) {took:.1f} s after the pods started {bad}")
unaligned = sorted(f"{u} {k}={vals[k]}" for u, vals in plan.items() for k in ("min", "low", "high")
                   if vals[k] != UINT64_MAX and vals[k] % PAGE)
check(unaligned, f"planned values that are not page multiples (the kernel rounds them down): {unaligned}")
web_slice = units["web"]["slice"]
held = show(web_slice, "MemoryLow")["MemoryLow"]
check_eq((held, read_memory(web_slice)["low"]), (str(plan[web_slice]["low"]), rounded(plan[web_slice]["low"])),
         f"{web_slice}: systemd holds MemoryLow unrounded, the kernel's memory.low page-rounded")


def systemd_values(unit):
    p = show(unit, *(prop for _, prop in KEYS))
    return {k: UINT64_MAX if p.get(prop) == "infinity" else int(p.get(prop) or -1) for k, prop in KEYS}


def kernel_vs_systemd(names):
    """Units whose cgroup does not show systemd's own values, page-rounded (what the daemon's
    cache holds after a GetAll or its own write)."""
    out = []
    kernel = kernel_memory(names)
    for u in names:
        sd = systemd_values(u)
        if kernel[u] is None:
            out.append(f"{u}: no cgroup")
            continue
        out += [f"{u} {k}: kernel {fmt_bytes(kernel[u][k])}, systemd {fmt_bytes(sd[k])}"
                for k, _ in KEYS if kernel[u][k] != rounded(sd[k])]
    return out


def calls():
    out = {}
    for labels, v in metrics().get("memqos_dbus_calls_total", []):
        out[labels["method"]] = out.get(labels["method"], 0) + int(v)
    return out


def grown(before, after=None):
    after = after if after is not None else calls()
    return {m: after.get(m, 0) - before.get(m, 0) for m in sorted(after) if after.get(m, 0) != before.get(m, 0)}


def resyncs(n, timeout):
    """Wait until the daemon has made `n` more timer resyncs (ListUnitsByPatterns calls: one per
    resync while nothing else happens). Returns (calls before, calls after, seconds)."""
    before, t0 = calls(), time.monotonic()
    ok = wait_for(lambda: grown(before).get("ListUnitsByPatterns", 0) >= n, timeout, 0.2)
    after = calls()
    check(ok, f"{n} timer resyncs within {timeout} s (ListUnitsByPatterns +{grown(before, after).get('ListUnitsByPatterns', 0)})")
    return before, after, time.monotonic() - t0


# --- steady: nothing read, nothing written -------------------------------------------------------
before, after, secs = resyncs(16, 90)
d = grown(before, after)
check(d.get("SetUnitProperties", 0) == 0,
      f"first cycle after the pods started ({secs:.1f} s): the new pod slices' one read; D-Bus calls {d}")
log(f"first cycle: GetAll +{d.get('GetAll', 0)} ({len(pods)} pod slices were new)")
diff = kernel_vs_systemd(sorted(plan))
check(not diff, f"every unit's cgroup shows systemd's own values, page-rounded {diff}")
before, after, secs = resyncs(16, 90)
d = grown(before, after)
check(d.get("GetAll", 0) == 0 and d.get("SetUnitProperties", 0) == 0,
      f"the next 16 timer resyncs (a full one among them, {secs:.1f} s): no GetAll, no write, over"
      f" {len(plan)} units ({sum(1 for u in plan if u.endswith('.scope'))} scopes); D-Bus calls {d}")
if d.get("GetAll", 0):
    log(f"kernel vs systemd: {kernel_vs_systemd(sorted(plan))}")


# --- a third party through systemd ---------------------------------------------------------------
def put_back(unit, key, other, timeout):
    """Change `unit`'s Memory<key> through systemd to `other`; return (seconds until the kernel
    shows the planned value again, D-Bus calls meanwhile)."""
    prop = dict(KEYS)[key]
    want = expected[unit][key]
    before = calls()
    t0 = time.monotonic()
    p = systemctl("set-property", "--runtime", unit, f"{prop}={other}")
    check(p.returncode == 0, f"systemctl set-property --runtime {unit} {prop}={fmt_bytes(other)} {p.stderr.strip()}")
    check_eq(read_memory(unit)[key], other, f"{unit}: the kernel shows the third party's {prop} at once")
    ok = wait_for(lambda: read_memory(unit)[key] == want, timeout, 0.05)
    took = time.monotonic() - t0
    time.sleep(2.5)  # anything the put-back causes
    d = grown(before)
    check(ok, f"{unit} memory.{key} back to {fmt_bytes(want)} {took:.1f} s after the third party's"
              f" set-property (limit {timeout} s); D-Bus calls meanwhile {d}")
    check_eq(systemd_values(unit)[key], plan[unit][key], f"{unit}: systemd holds the planned {prop} again")
    return took, d


api_slice = units["api"]["slice"]
took, d = put_back(api_slice, "low", 7 * MIB, 40)
check(d.get("GetAll", 0) == 1 and d.get("SetUnitProperties", 0) == 1,
      f"pod slice: GetAll +{d.get('GetAll', 0)}, SetUnitProperties +{d.get('SetUnitProperties', 0)} (1 and 1)")

qos = "kubepods-burstable.slice"
took, d = put_back(qos, "low", 5 * MIB, 8)
check(took < 4.0 and d.get("GetAll", 0) == 1 and d.get("SetUnitProperties", 0) == 1,
      f"QoS slice by the watch or the light resync: {took:.1f} s, GetAll +{d.get('GetAll', 0)},"
      f" SetUnitProperties +{d.get('SetUnitProperties', 0)} (within 2 intervals, 1 and 1)")

# --- behind systemd's back ---------------------------------------------------------------------
path = os.path.join(slice_cgroup_dir(api_slice), "memory.low")
want = expected[api_slice]["low"]
other = 3 * MIB
before = calls()
with open(path, "w") as f:
    f.write(str(other))
t0 = time.monotonic()
check_eq(read_memory(api_slice)["low"], other, f"{api_slice} memory.low written directly: {fmt_bytes(other)}")
ok = wait_for(lambda: read_memory(api_slice)["low"] == want, 40, 0.05)
took = time.monotonic() - t0
time.sleep(2.5)  # anything the put-back causes
d = grown(before)
check(ok and d.get("GetAll", 0) == 1 and d.get("SetUnitProperties", 0) == 1,
      f"the next full resync read {api_slice} over D-Bus and set its MemoryLow again, {took:.1f} s after the write"
      f" (systemd held {fmt_bytes(systemd_values(api_slice)['low'])} throughout); the file shows the plan again;"
      f" D-Bus calls {d}")
before, after, secs = resyncs(16, 90)
d = grown(before, after)
check(d.get("GetAll", 0) == 0 and d.get("SetUnitProperties", 0) == 0,
      f"once the file shows the planned value again: 16 timer resyncs ({secs:.1f} s) with no GetAll, no write {d}")
bad, _ = wait_kernel(expected, 5)
check(not bad, f"all {len(expected)} units equal plan at the end {bad}")
