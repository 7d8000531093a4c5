#!/usr/bin/python3
"""Benchmark: does the protection protect? Pods under memory pressure in the e2e VM.

    /usr/bin/python3 bench/protection.py --write docs/BENCHMARKS.md

One VM boot (tests/e2e/vm.py: Debian bookworm, systemd 252, kernel 6.1 with memory_recursiveprot,
qemu TCG, 1 GiB, no swap), the .deb built from a clean clone of HEAD; the guest side is
bench/scenarios/60-protection.py. For each configuration (no daemon; `hierarchy: kubelet`;
`hierarchy: effective` with each memoryReservationPolicy) and each kind of pressure from a
BestEffort neighbour (streaming a file, allocating anonymous memory until the OOM killer acts,
both at once), new Guaranteed and Burstable pods fill their working sets (page cache and
anonymous memory) with the pods' requests adding up to ~90 % of allocatable; measured: what each
protected pod keeps (memory.stat file/anon before and after), OOM kills and whom they hit,
memory.events low counts, the time to re-touch and re-read the working set afterwards. Then
memory.high: a Burstable container allocates past its MemoryHigh (progress, and the throttle
events in memqos_container_memory_high_events_total).

Writes a table between the `protection` markers of --write, and the plot docs/protection.png
(--plot). The plot needs matplotlib, which the product does not depend on: install it for the
benchmark only, `apt-get install python3-matplotlib`, and run this with /usr/bin/python3.
Waits while another qemu-system runs. About 15-20 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vmbench  # noqa: E402

SCENARIO = "60-protection"
MARKER = "protection"
CEILING_CFG = "effective / Tiered + ceiling"
KUBELET_TODAY = "kubelet of today / Tiered"
KUBELET_COMPANION = "kubelet of today / Tiered + companion (ceiling)"
# Issue 36's run: the kubelet of today alone and with the companion, ours alone, Hard; one boot.
COMPANION_RUN = [KUBELET_TODAY, KUBELET_COMPANION, "effective / Tiered", "effective / Hard"]
LEVER_CFG = "effective / Tiered + lever"
CEILING_LEVER_CFG = "effective / Tiered + ceiling + lever"
TIERED_SWAP = "swap: effective / Tiered"
LEVER_SWAP = "swap: effective / Tiered + lever"
CEILING_LEVER_SWAP = "swap: effective / Tiered + ceiling + lever"
# Issue 35's run: the lever without and with the ceiling, the default beside them; then with swap.
LEVER_RUN = [LEVER_CFG, "effective / Tiered", TIERED_SWAP, LEVER_SWAP, CEILING_LEVER_CFG, CEILING_LEVER_SWAP]
# Issue 42's run: the packaged config beside a stand-in of the v1.37 kubelet at its defaults (its
# gate on, no policy, no factor: the start's and the containers' zeros, nothing after), and ours
# alone beside it in the same boot.
STANDIN_CFG = "effective / Tiered beside a v1.37 kubelet at its defaults (stand-in)"
STANDIN_RUN = [STANDIN_CFG, "effective / Tiered"]
# The last boot that ran the configurations issue 25's run leaves out (no daemon, kubelet, None).
EARLIER = "bench/results/protection.json"

CONFIGS = [
    {"name": "no daemon", "daemon": False},
    {"name": "kubelet / Tiered", "daemon": True, "hierarchy": "kubelet", "policy": "TieredReservation"},
    # None sets no protection (only MemoryHigh): one kind of pressure shows it equals "no daemon".
    {"name": "effective / None", "daemon": True, "hierarchy": "effective", "policy": "None", "pressures": ["file"]},
    {"name": "effective / Tiered", "daemon": True, "hierarchy": "effective", "policy": "TieredReservation",
     "pressures": ["file", "anon", "mix", "burst", "none", "price"]},
    # The planned BestEffort ceiling (issue 25) at its defaults.
    {"name": CEILING_CFG, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation",
     "ceiling": {}, "pressures": ["file", "anon", "mix", "burst", "none"]},
    {"name": "effective / Hard", "daemon": True, "hierarchy": "effective", "policy": "HardReservation",
     "pressures": ["file", "anon", "mix", "burst", "none"]},
    # Issue 36: the values the kubelet of v1.37 writes with its Memory QoS on (`hierarchy: kubelet`,
    # written here by the daemon: no kubelet runs in the guest), alone and with what companion mode
    # adds beside it (the BestEffort ceiling; companion mode itself writes only that MemoryMax).
    {"name": KUBELET_TODAY, "daemon": True, "hierarchy": "kubelet", "policy": "TieredReservation",
     "pressures": ["file", "anon", "mix", "burst", "none"]},
    {"name": KUBELET_COMPANION, "daemon": True, "hierarchy": "kubelet", "policy": "TieredReservation",
     "ceiling": {}, "pressures": ["file", "anon", "mix", "burst", "none"]},
    # Issue 35: the Burstable lever (`burstableHigh: {enabled: true}`, headroom 0) on the default, and
    # with the ceiling; "price" is a lone Burstable pod without a limit growing on an idle node.
    {"name": LEVER_CFG, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation", "lever": {},
     "pressures": ["file", "anon", "mix", "burst", "none", "price"]},
    {"name": CEILING_LEVER_CFG, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation",
     "ceiling": {}, "lever": {}, "pressures": ["file", "anon", "mix", "burst", "none"]},
    # Issue 35's swap rows: the guest switches a swap file on for these (SWAP_MIB) and every
    # container scope gets the MemorySwapMax the kubelet's LimitedSwap asks the runtime for.
    {"name": TIERED_SWAP, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation", "swap": True,
     "pressures": ["file", "anon", "mix", "burst", "none"]},
    {"name": LEVER_SWAP, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation", "swap": True,
     "lever": {}, "pressures": ["file", "anon", "mix", "burst", "none"]},
    {"name": CEILING_LEVER_SWAP, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation",
     "swap": True, "ceiling": {}, "lever": {}, "pressures": ["file", "anon", "mix", "burst", "none"]},
    # Issue 42: the packaged config (TieredReservation, companion: auto) beside the kubelet stand-in.
    {"name": STANDIN_CFG, "daemon": True, "hierarchy": "effective", "policy": "TieredReservation", "standin": True,
     "pressures": ["file", "anon", "mix", "burst"]},
]
PRESSURES = ["file", "anon", "mix", "burst"]
ALL_PRESSURES = PRESSURES + ["none"]
PRESSURE_TEXT = {"file": "streams a file", "anon": "allocates until OOM", "mix": "holds anon + streams",
                 "burst": "is Burstable, allocates until OOM", "none": "no neighbour",
                 "price": "a lone Burstable pod grows on an idle node"}
# The configurations of issue 25's run: one boot, these rows side by side.
CEILING_RUN = [CEILING_CFG, "effective / Tiered", "effective / Hard"]


def params(args) -> dict:
    names = args.configs.split(",") if args.configs else CEILING_RUN
    return {
        # in the order asked for (the run that matters most first: a guest lost late keeps it)
        "configs": CONFIGS if names == ["all"] else [c for n in names for c in CONFIGS if c["name"] == n],
        "pressures": args.pressures.split(","), "default_pressures": PRESSURES, "idle_s": 30,
        "g_request_mib": 192, "g_anon_mib": 80, "g_file_mib": 64,
        "b_request_mib": 320, "b_anon_mib": 32, "b_file_mib": 256,
        "b2_anon_mib": 16, "requests_fraction": 0.9,
        "stream_mib": 1024, "stream_passes": 1, "hog_anon_mib": 1600, "mix_anon_mib": 256, "bn_request_mib": 64,
        "health_interval_s": 1.0,
        "footprint": not args.no_footprint, "footprint_pods": 110, "footprint_settle_s": 20, "footprint_refault_s": 60,
        "pressure_timeout_s": 240,
        "price_timeout_s": 90, "swap_mib": 512,
        "high_request_mib": 64, "high_limit_mib": 256, "high_over_mib": 12, "high_timeout_s": 180,
        "high_test": not args.no_high, "lowering": not args.no_lowering,
    }


def kept(p, kind):
    b, a = p["before"][kind], p["after"][kind]
    return a, b


def cell_kept(p, kind):
    a, b = kept(p, kind)
    if b < 1:
        return "—"
    return f"{b:.0f} → {a:.0f} ({100 * a / b:.0f} %)"


def kills_str(run):
    ks = run.get("oom_kills") or []
    if not ks:
        if run.get("timed_out") and run["pressure"] != "mix":  # mix's allocator holds until the stream ends
            return f"none (the neighbour was still running when the benchmark stopped it, after {run['pressure_s']:.0f} s)"
        return "none"
    by = {}
    for k in ks:
        by[k["pod"]] = by.get(k["pod"], 0) + 1
    names = {"BE": "BestEffort neighbour", "BN": "Burstable neighbour", "G": "**Guaranteed**", "B": "**Burstable**",
             "B2": "**idle Burstable**"}
    return ", ".join(f"{names.get(p, p)} ×{n}" for p, n in by.items())


def reread(p):
    r = p.get("reuse") or {}
    parts = []
    if "file_reread_s" in r:
        parts.append(f"{r['file_reread_s'] * 1e3:,.0f} ms")
    if not p.get("alive", True):
        return "killed"
    return " / ".join(parts) or "—"


def retouch(p):
    """G's re-fault latency: the time to touch its anonymous working set again afterwards."""
    r = p.get("reuse") or {}
    if not p.get("alive", True):
        return "killed"
    return f"{r['anon_retouch_s'] * 1e3:,.0f} ms" if "anon_retouch_s" in r else "—"


def glance(r: dict) -> list[str]:
    """The table an operator reads first: per configuration, what B keeps under each pressure,
    the worst G kept, and whom the OOM killer took."""
    runs = [x for x in r["runs"] if "error" not in x and x["pressure"] != "price"]
    configs = list(dict.fromkeys(x["config"] for x in runs))
    pressures = [p for p in PRESSURES if any(x["pressure"] == p for x in runs)]
    who = {"BE": "BestEffort neighbour", "BN": "Burstable neighbour", "G": "**Guaranteed**", "B": "**Burstable**",
           "B2": "**idle Burstable**"}
    out = ["| configuration | " + " | ".join(f"B keeps, neighbour {PRESSURE_TEXT[p]}" for p in pressures)
           + " | G keeps (worst: anon / page cache) | OOM kills, by victim |",
           "|---|" + "---:|" * len(pressures) + "---|---|"]
    for cfg in configs:
        mine = [x for x in runs if x["config"] == cfg]
        if not mine:
            continue
        cells = []
        for pr in pressures:
            run = next((x for x in mine if x["pressure"] == pr), None)
            if run is None:
                cells.append("not run")
                continue
            a, b = kept(run["pods"]["B"], "file")
            v = min(100.0, 100 * a / b) if b else float("nan")
            cells.append(f"**{v:.0f} %**" if v >= 90 else f"{v:.0f} %")
        g_anon, g_file = [], []
        for run in mine:
            G = run["pods"]["G"]
            if not G["alive"]:
                g_anon.append(0.0)
                g_file.append(0.0)
                continue
            for kind, acc in (("anon", g_anon), ("file", g_file)):
                a, b = kept(G, kind)
                if b:
                    acc.append(min(100.0, 100 * a / b))
        victims = {}
        for run in mine:
            for k in run.get("oom_kills") or []:
                victims[k["pod"]] = victims.get(k["pod"], 0) + 1
        kills = ", ".join(f"{who.get(k, k)} ×{n}" for k, n in victims.items()) or "none"
        label = f"**{cfg}** (the default)" if cfg == "effective / Tiered" else cfg
        out.append(f"| {label} | " + " | ".join(cells) +
                   f" | {min(g_anon):.0f} % / {min(g_file):.0f} % | {kills} |")
    return out


def _ms(x):
    return "—" if x is None else f"{x * 1e3:,.0f} ms"


def _mib(x):
    return "—" if x is None else f"{x / MIB:.1f}"


MIB = 1 << 20


def footprint_section(r: dict) -> list[str]:
    """The daemon's own memory, what its unit's MemoryMin and MemoryLow are sized from."""
    f = r.get("footprint")
    if not f:
        return []
    n = f["pods"]
    rows = [("no pod", "no_pods"), (f"{n} pods", f"pods_{n}"), (f"{n} pods, right after memory.reclaim", "after_reclaim"),
            (f"{n} pods, a minute later (the working set read back in)", "working_set")]
    out = ["### The daemon's own memory",
           "",
           f"The service's cgroup ({f['no_pods']['service']['cgroup']}) at rest with no pod, then with {n} running "
           "pods (one container each), then emptied of every file page it could by `memory.reclaim` and left a "
           "minute at work (resyncs, pod polls, a scrape every 15 s). memory.current counts the pages charged to "
           "the cgroup: a file page is charged to whoever read it first, so the daemon's code read earlier by "
           "another process (the package's installer, another Python) is charged there until it is reclaimed and "
           "read back by the daemon. RSS is the process's view (anonymous + mapped file pages, wherever charged).",
           "",
           "| state | memory.current (MiB) | anon | file | kernel | RSS anon / file (MiB) | peak (MiB) |",
           "|---|---:|---:|---:|---:|---|---:|"]
    for label, key in rows:
        m = f.get(key)
        if not m:
            continue
        s, st, p = m["service"], m["service"]["stat"], m.get("proc") or {}
        out.append(f"| {label} | {_mib(s['current'])} | {_mib(st.get('anon'))} | {_mib(st.get('file'))} | "
                   f"{_mib(st.get('kernel'))} | {_mib(p.get('RssAnon'))} / {_mib(p.get('RssFile'))} | {_mib(s.get('peak'))} |")
    out.append("")
    return out


def daemon_section(r: dict) -> list[str]:
    """The daemon's health in every run: what issue 25 asks of it."""
    runs = [x for x in r["runs"] if "error" not in x and "daemon" in x]
    if not runs:
        return []
    out = ["### The daemon under pressure",
           "",
           "From convergence to the end of each run, a sampler with its memory locked (`bench/guest/health.py`, "
           "mlockall of the pages it touches, so that its own stalls do not count; about 16 MiB) asked, in one loop, "
           "`/metrics` every second (10 s timeout) and `/livez`, which says how long ago the daemon's loop last beat (it beats every "
           "10 s, and pings the watchdog then; by the daemon's own clock, so the longest age is how late its loop "
           "ran), and, in another loop, read the time PID 1 took the daemon's last watchdog ping (`WatchdogTimestampMonotonic`: a "
           "long gap there with no kill is PID 1 itself stalled, which reads the queued ping before its watchdog "
           "timer when it resumes) and the service cgroup's memory.current and `low` count. Restarts: `NRestarts` and `MainPID` before and after; watchdog kills: systemd's "
           "`Watchdog timeout` lines in the journal. Writes: `SetUnitProperties` calls after convergence (the "
           "neighbour's new container scope takes one; the ceiling's steps more).",
           "",
           "| configuration | neighbour | `/metrics` slowest during the pressure (s) | failed | the loop's longest "
           "time without a beat (s) | longest gap between the pings PID 1 took (s) | watchdog kills / restarted | service `low` events | service memory.current "
           "(MiB, min → max) | its file pages read back (refaults) | writes after convergence |",
           "|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|"]
    for x in runs:
        d, h = x["daemon"], x["daemon"]["health"]
        slow = h.get("max_during_s")
        out.append(
            f"| {x['config']} | {PRESSURE_TEXT[x['pressure']]} | {'—' if slow is None else f'{slow:.2f}'} | "
            f"{h.get('failed', '—')} of {h.get('scrapes', '—')} | "
            f"{'—' if h.get('max_loop_age_s') is None else format(h['max_loop_age_s'], '.1f')} | "
            f"{'—' if h.get('max_ping_gap_s') is None else format(h['max_ping_gap_s'], '.1f')} | "
            f"{len(d['watchdog_kills'])} / {'**yes**' if d['restarted'] else 'no'} | {d['low_events']} | "
            f"{_mib(h.get('cur_min'))} → {_mib(h.get('cur_max'))} | {h.get('refault_delta', '—')} | "
            f"{'—' if d['writes_after_convergence'] is None else format(d['writes_after_convergence'], '.0f')} |")
    kills = sum(len(x["daemon"]["watchdog_kills"]) for x in runs)
    restarts = sum(1 for x in runs if x["daemon"]["restarted"])
    slowest = max((x["daemon"]["health"].get("max_s") or 0 for x in runs), default=0)
    failed = sum(x["daemon"]["health"].get("failed") or 0 for x in runs)
    lows = sum(x["daemon"]["low_events"] for x in runs)
    gap = max((x["daemon"]["health"].get("max_ping_gap_s") or 0 for x in runs), default=0)
    age = max((x["daemon"]["health"].get("max_loop_age_s") or 0 for x in runs), default=0)
    boot = r.get("daemon_boot") or dict(runs[0].get("daemon_before") or {}, ControlGroup=(r.get("footprint") or {})
                                        .get("no_pods", {}).get("service", {}).get("cgroup", "?"))
    out += ["", f"In all {len(runs)} runs: {kills} watchdog kills, {restarts} restarts; the slowest `/metrics` "
            f"{slowest:.2f} s, {failed} failed; the service's `low` count rose by {lows}; its loop went at most "
            f"{age:.1f} s without a beat; the longest gap between two watchdog pings PID 1 took {gap:.1f} s "
            f"(WatchdogUSec {boot.get('WatchdogUSec', '?')})."
            + (f" For the whole boot, systemd counted NRestarts={boot.get('NRestarts', '?')} and logged "
               f"{len(boot['watchdog_kills'])} watchdog timeouts." if "watchdog_kills" in boot else "")
            + " The unit as it ran: MemoryMin "
            f"{boot.get('MemoryMin', '?')}, MemoryLow {boot.get('MemoryLow', '?')}, OOMScoreAdjust "
            f"{boot.get('OOMScoreAdjust', '?')}, cgroup {boot.get('ControlGroup', '?')}.", ""]
    return out


def ceiling_value(r: dict) -> list[str]:
    """Why the ceiling is what it is in this run: the formula, or its minimum."""
    g, P = r["guest"], r["params"]
    requests = sum(g["requests_mib"][k] for k in ("G", "B", "B2"))
    formula = g["allocatable"] / MIB - requests - 256
    return [f"The plan: allocatable {g['allocatable'] / MIB:.0f} MiB − the requests {requests} MiB − the default "
            f"headroom 256 MiB = {formula:.0f} MiB" + (", below the default minimum, 64 MiB: the ceiling sits at its "
                                                       "minimum in every run (the requests fill "
                                                       f"{100 * P['requests_fraction']:.0f} % of allocatable)."
                                                       if formula < 64 else "."), ""]


def ceiling_section(r: dict) -> list[str]:
    """Where the ceiling held BestEffort, and how fast the kernel acted once it was reached."""
    runs = [x for x in r["runs"] if "error" not in x and (x.get("ceiling") or {}).get("memory_max")]
    if not runs:
        return []
    out = ["### The BestEffort ceiling at work",
           "",
           "Sampled every 0.1 s: `kubepods-besteffort.slice`'s memory.max (the ceiling, as the kernel holds it) and "
           "its memory.events `max` count (the times its usage met memory.max); the OOM kill's time is the kernel's "
           "own (the journal's monotonic timestamp of the `oom-kill` line). \"Reached\" is the first sample whose "
           "`max` count had risen: up to 0.1 s late, more when the guest stalls.",
           "",
           *ceiling_value(r),
           "| configuration | neighbour | memory.max (MiB) | reached after the pressure began (s) | reached → OOM kill (s) "
           "| `max` events | OOM kills |",
           "|---|---|---:|---:|---:|---:|---|"]
    for x in runs:
        c = x["ceiling"]
        reach = c.get("reached_s")
        kill = c.get("kill_after_reached_s")
        out.append(f"| {x['config']} | {PRESSURE_TEXT[x['pressure']]} | {_mib(c['memory_max'])} | "
                   f"{'never' if reach is None else f'{reach:.1f}'} | {'—' if kill is None else f'{kill:.2f}'} | "
                   f"{c.get('max_events', '—')} | {kills_str(x)} |")
    out.append("")
    return out


def earlier_glance(r: dict, earlier: dict | None) -> list[str]:
    """The configurations this boot did not run, from an earlier boot's raw results (their values
    have not changed since): the same table, said to be another boot's."""
    if not earlier:
        return []
    mine = {x["config"] for x in r["runs"]}
    old = dict(earlier["result"], runs=[x for x in earlier["result"]["runs"] if x["config"] not in mine])
    if not old["runs"]:
        return []
    return ["", f"Not run in this boot, from the boot of {earlier['meta']['commit']} ({earlier['host']['started']}, "
            f"`{EARLIER}`; what they set has not changed since):", "", *glance(old)]


def render(r: dict, host: dict, meta: dict, plot_name: str | None, earlier: dict | None = None) -> str:
    g = r["guest"]
    P = r["params"]
    L = vmbench.load_str
    req = g["requests_mib"]
    lines = [
        f"<!-- {MARKER}:start -->",
        "## Protection under memory pressure (VM)",
        "",
        f"Command: `/usr/bin/python3 bench/protection.py --write docs/BENCHMARKS.md` (one VM boot, "
        f"{host['wall_s'] / 60:.0f} min on {host['started']}). Commit {meta['commit']}. "
        f"Host: {meta['machine']['cores']} cores, {meta['machine']['cpu']}; load average before/after "
        f"{host['load_before'][0]} / {host['load_after'][0]}." + (f" Note: {host['note']}." if host.get("note") else ""),
        f"Guest: kernel {g['kernel']}, {g['systemd']}, cgroup v2 with `memory_recursiveprot`, "
        f"{g['capacity'] / 2**20:.0f} MiB, swap {g['swap']} kB, TCG. Allocatable {g['allocatable'] / 2**20:.0f} MiB "
        f"(capacity − the default evictionHard 100Mi"
        + (f" − systemReserved {g['system_reserved_mib']}Mi, the daemon's own MemoryMin counted there as"
           f" docs/DESIGN.md asks" if g.get("system_reserved_mib") else "") + ").",
        "",
        "### At a glance",
        "",
        f"How much of its page cache a Burstable pod (**B**, request {req['B']} Mi, {P['b_file_mib']} MiB of cached "
        "file) still holds after a neighbour pressed, per configuration of memqos-systemd (bold: 90 % or "
        "more; capped at 100 %: the kernel's count can grow by a few pages); the "
        "Guaranteed pod's (**G**) worst run; and whom the OOM killer took in all runs of that row.",
        "",
        *glance(r),
        *earlier_glance(r, earlier),
        "",
        f"Pods (new ones for every run): **G** Guaranteed, request = limit {req['G']} Mi, holds "
        f"{P['g_anon_mib']} MiB anonymous + {P['g_file_mib']} MiB page cache; **B** Burstable, request "
        f"{req['B']} Mi, no limit, holds {P['b_file_mib']} MiB page cache + {P['b_anon_mib']} MiB anonymous; "
        f"**B2** Burstable, request {req['B2']} Mi mostly unused ({P['b2_anon_mib']} MiB), so that requests add "
        f"up to {100 * P['requests_fraction']:.0f} % of allocatable; **BE** the BestEffort neighbour: *file* = "
        f"reads a {P['stream_mib'] / 1024:.1f} GiB file {P['stream_passes']}×, *anon* = allocates up to "
        f"{P['hog_anon_mib']} MiB (more than the machine: the OOM killer must act), *mix* = holds "
        f"{P['mix_anon_mib']} MiB anonymous while it streams the file; **BN** instead of BE for *burst*: a "
        f"Burstable neighbour, request {P.get('bn_request_mib', '?')} Mi and no limit (B2's request is smaller by as "
        f"much), that allocates up to {P['hog_anon_mib']} MiB; *none*: no neighbour, {P.get('idle_s', 30)} s of nothing. "
        "Every process has the kubelet's "
        "oom_score_adj for its QoS class (G −997, BE 1000, B by request); G's slice and scope have "
        "MemoryMax = limit, as the kubelet and runc set them. Caches are dropped before each run.",
        "",
        "Configurations: *no daemon* (nothing set); *kubelet / Tiered* = `hierarchy: kubelet` (the KEP's "
        "literal numbers: `kubepods.slice` MemoryMin = all requests, MemoryLow 0) with TieredReservation; "
        "*effective / None|Tiered|Hard* = the default `hierarchy: effective` with each "
        "`memoryReservationPolicy` (None sets only MemoryHigh); *+ ceiling* = with `bestEffortCeiling: {enabled: "
        "true}` at its defaults: `kubepods-besteffort.slice` MemoryMax = allocatable − the Guaranteed and Burstable "
        "requests − headroom.",
        "",
        "| configuration | pressure | B page cache kept (MiB) | B `low` events | G anon kept | G page cache kept | OOM kills | re-fault: B re-reads its file / G re-touches its anon | load (host / guest) |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for run in r["runs"]:
        if run["pressure"] == "price":
            continue
        if "error" in run:
            lines.append(f"| {run['config']} | {run['pressure']} | run failed: {run['error'][:80]} | | | | | | |")
            continue
        B, G = run["pods"]["B"], run["pods"]["G"]
        lines.append(
            f"| {run['config']} | {run['pressure']} ({PRESSURE_TEXT[run['pressure']]}) | {cell_kept(B, 'file')} | "
            f"{B['events']['low']} | {cell_kept(G, 'anon') if G['alive'] else '**killed**'} | {cell_kept(G, 'file')} | "
            f"{kills_str(run)} | {reread(B)} / {retouch(G)} | {L(run.get('stamp'))} |")
    lines.append("")
    # what the numbers say, from the numbers
    def find(cfg, pr):
        return next((x for x in r["runs"] if x.get("config") == cfg and x.get("pressure") == pr and "error" not in x), None)

    def pct(run, pod="B", kind="file"):
        a, b = kept(run["pods"][pod], kind)
        return 100 * a / b if b else float("nan")

    notes = []
    for cfg in ("no daemon", "kubelet / Tiered", KUBELET_TODAY, KUBELET_COMPANION, "effective / Tiered", CEILING_CFG,
                "effective / Hard"):
        f, a, b = find(cfg, "file"), find(cfg, "anon"), find(cfg, "burst")
        if f and a:
            notes.append(f"*{cfg}*: B keeps {pct(f):.0f} % of its page cache against a streaming neighbour and "
                         f"{pct(a):.0f} % against an allocating one"
                         + (f", {pct(b):.0f} % against an allocating Burstable one" if b else ""))
    if notes:
        lines += ["Read: " + "; ".join(notes) + "."]
        t_a, h_a = find("effective / Tiered", "anon"), find("effective / Hard", "anon")
        k_f, e_f = find("kubelet / Tiered", "file"), find("effective / Tiered", "file")
        if k_f and e_f and pct(k_f) < 50 <= pct(e_f):
            lines[-1] += (" With the KEP's literal layout (`hierarchy: kubelet`) the Burstable pod's MemoryLow is worth "
                          "nothing to the kernel (`kubepods.slice` has no MemoryLow above it); the same values backed "
                          "on every ancestor (`effective`) hold.")
        if t_a and h_a and pct(t_a) < 50 and pct(h_a) >= 90:
            lines[-1] += (" Against anonymous allocation MemoryLow (Tiered) yields before the OOM killer acts, as "
                          "memory.low is defined to; MemoryMin (Hard) does not.")
        lines += ["", "`low` events: the kernel's count of reclaim below a cgroup's memory.low (memory.events has no "
                  "such count for memory.min). Re-fault: the time B took to read its file again afterwards (a page "
                  "cache hit, or a disk read through virtio under TCG) and G to touch its anonymous pages again "
                  "(no swap: they are never evicted, only the file pages can be).", ""]
    if plot_name:
        lines += [f"![protection]({plot_name})", ""]
    lines += ceiling_section(r) + daemon_section(r) + footprint_section(r)
    h = r.get("high")
    if h:
        res = h.get("result") or {}
        steps = res.get("steps_s", [])
        high_mib = h["expected_high"] / 2**20
        below = [s for i, s in enumerate(steps) if i + 8 < high_mib]
        above = [s for i, s in enumerate(steps) if i >= high_mib]
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
        lines += [
            "### memory.high throttling",
            "",
            f"A Burstable container (request {h['request_mib']} Mi, limit {h['limit_mib']} Mi: MemoryMax = limit as runc "
            f"sets it; MemoryHigh from the daemon {h['memory_high']} = {h['memory_high'] / 2**20:.1f} MiB, expected "
            f"{h['expected_high']}) allocates anonymous memory in 1 MiB steps up to {h['target_mib']} MiB, "
            f"{P['high_over_mib']} MiB past MemoryHigh, with no swap.",
            "",
            "| figure | value |",
            "|---|---:|",
            f"| reached the target (progress, no livelock) | {'**yes**' if res.get('done') else '**no**'}: "
            f"{len(steps)} of {h['target_mib']} steps in {h['seconds']:.1f} s |",
            f"| median time of a 1 MiB step below MemoryHigh / past it | {med(below) * 1e3:.1f} ms / {med(above) * 1e3:.0f} ms |",
            f"| longest step | {max(steps) * 1e3 if steps else float('nan'):.0f} ms |",
            f"| memory.events `high` during the test (kernel) / `max` / `oom_kill` | {h['events']['high']} / "
            f"{h['events']['max']} / {h['events']['oom_kill']} |",
            f"| `memqos_container_memory_high_events_total` for the scope (daemon, read at the scrape; metrics.perUnit) | "
            f"{h['metric_high_events']:.0f} (kernel total {h['kernel_high_events_total']}) |",
            f"| load (host / guest) | {L(h.get('stamp'))} |",
            "",
        ]
    lines += [
        "Limits of this run: one run per cell (the VM's 20-minute budget), so small differences are noise; "
        "TCG slows every access, which changes how fast reclaim and the OOM killer act, not which pages the "
        "kernel protects; a 1 GiB guest, so the pods are small; the 'pods' are slices and scopes made over "
        "D-Bus as the kubelet's systemd driver and runc make them, their processes are our workload.",
        f"<!-- {MARKER}:end -->",
    ]
    return "\n".join(lines)


LEVER_MARKER = "protection-lever"
WHO = {"BE": "BestEffort neighbour", "BN": "Burstable neighbour", "G": "**Guaranteed**", "B": "**Burstable**",
       "B2": "**idle Burstable**"}


def _b_keeps(run) -> str:
    if run is None:
        return "not run"
    if "error" in run:
        return "failed"
    a, b = kept(run["pods"]["B"], "file")
    v = min(100.0, 100 * a / b) if b else float("nan")
    return f"**{v:.0f} %**" if v >= 90 else f"{v:.0f} %"


def _victims(runs) -> str:
    v = {}
    for run in runs:
        for k in run.get("oom_kills") or []:
            v[k["pod"]] = v.get(k["pod"], 0) + 1
    return ", ".join(f"{WHO.get(k, k)} ×{n}" for k, n in v.items()) or "none"


def lever_tables(r: dict) -> list[str]:
    """Issue 35's tables: per configuration, what B keeps against each neighbour without swap and
    with it side by side, G's worst, OOM kills by victim, B's `low` events; every run's detail; the
    lever's price (a lone Burstable pod on an idle node)."""
    runs = [x for x in r["runs"] if x["pressure"] != "price"]
    ok = [x for x in runs if "error" not in x]
    base = list(dict.fromkeys(x["config"].removeprefix("swap: ") for x in runs))
    pressures = [p for p in ALL_PRESSURES if any(x["pressure"] == p for x in ok) and p != "none"]

    def find(cfg, pr):
        return next((x for x in runs if x["config"] == cfg and x["pressure"] == pr), None)

    out = ["| configuration | " + " | ".join(f"B keeps, neighbour {PRESSURE_TEXT[p]} (no swap / swap)"
                                              for p in pressures)
           + " | G keeps, worst anon / page cache (no swap / swap) | OOM kills, by victim: no swap / swap |",
           "|---|" + "---:|" * len(pressures) + "---|---|"]
    for cfg in base:
        cells = [f"{_b_keeps(find(cfg, p))} / {_b_keeps(find('swap: ' + cfg, p))}" for p in pressures]
        g = []
        for c in (cfg, "swap: " + cfg):
            mine = [x for x in ok if x["config"] == c]
            if not mine:
                g.append("not run")
                continue
            an = [0.0 if not x["pods"]["G"]["alive"] else min(100.0, 100 * kept(x["pods"]["G"], "anon")[0] /
                                                              max(kept(x["pods"]["G"], "anon")[1], 1e-9))
                  for x in mine]
            fi = [0.0 if not x["pods"]["G"]["alive"] else min(100.0, 100 * kept(x["pods"]["G"], "file")[0] /
                                                              max(kept(x["pods"]["G"], "file")[1], 1e-9))
                  for x in mine]
            g.append(f"{min(an):.0f}/{min(fi):.0f} %")
        kills = [_victims([x for x in ok if x["config"] == c]) if any(x["config"] == c for x in ok) else "not run"
                 for c in (cfg, "swap: " + cfg)]
        label = f"{cfg} (the default)" if cfg == "effective / Tiered" else cfg
        out.append(f"| {label} | " + " | ".join(cells) + f" | {' / '.join(g)} | {' / '.join(kills)} |")
    out += ["", "Every run: B's page cache (and anonymous memory; with swap, what its slice had in swap after),"
            " B's `low` events, G, the OOM kills, the neighbour's slice at the end (memory.high, memory.peak).", "",
            "| configuration | neighbour | B page cache kept (MiB) | B anon before → after (swapped) | B `low` events "
            "| G anon kept | G page cache kept | OOM kills | neighbour memory.high / peak (MiB) | swap used at the end "
            "(MiB) |",
            "|---|---|---:|---|---:|---:|---:|---|---|---:|"]
    for x in runs:
        if "error" in x:
            out.append(f"| {x['config']} | {x['pressure']} | run failed: {x['error'][:80]} | | | | | | | |")
            continue
        B, G, n = x["pods"]["B"], x["pods"]["G"], x.get("neighbour") or {}
        hi = n.get("memory_high")
        hi = "max" if hi is None or hi >= 1 << 62 else _mib(hi)
        sw = x.get("swap")
        out.append(f"| {x['config']} | {PRESSURE_TEXT[x['pressure']]} | {cell_kept(B, 'file')} | "
                   f"{B['before']['anon']:.0f} → {B['after']['anon']:.0f}"
                   + (f" ({B['after'].get('swap', 0):.0f})" if sw else "") + f" | {B['events']['low']} | "
                   f"{cell_kept(G, 'anon') if G['alive'] else '**killed**'} | {cell_kept(G, 'file')} | {kills_str(x)} | "
                   f"{hi} / {_mib(n.get('peak'))} | {'—' if not sw else format(sw['used_kib'] / 1024, '.0f')} |")
    price = [x for x in r["runs"] if x["pressure"] == "price" and "error" not in x]
    if price:
        out += ["", "The lever's price: a lone Burstable pod (request "
                f"{r['params'].get('bn_request_mib')} Mi, no limit) allocates anonymous memory in 32 MiB steps up to "
                f"{r['params']['hog_anon_mib']} MiB on an idle node: the other pods (G, B, B2) are there with their "
                "requests and hold nothing. How far it got (its slice's memory.peak, the kernel's), as a share of "
                "allocatable, and when it first came within 5 % of that (memory.current sampled every 0.1 s); "
                f"stopped after {r['params'].get('price_timeout_s', '?')} s if still running.", "",
                "| configuration | its MemoryHigh (MiB) | grew to (MiB) | of allocatable | within 5 % of that after (s) "
                "| how it ended |", "|---|---:|---:|---:|---:|---|"]
        for x in price:
            p, n = x["price"], x.get("neighbour") or {}
            hi = n.get("memory_high")
            hi = "max" if hi is None or hi >= 1 << 62 else _mib(hi)
            end = (f"OOM-killed ({_victims([x])}) after {x['pressure_s']:.0f} s" if x.get("oom_kills") else
                   f"still allocating{', throttled at its MemoryHigh' if hi != 'max' else ', in reclaim'}, stopped at "
                   f"{x['pressure_s']:.0f} s" if x.get("timed_out") else
                   f"done after {x['pressure_s']:.0f} s")
            out.append(f"| {x['config']} | {hi} | {_mib(p['peak'])} | {100 * p['peak'] / p['allocatable']:.0f} % | "
                       f"{'—' if p.get('to_95_s') is None else format(p['to_95_s'], '.1f')} | {end} |")
    return out


def standin_tables(r: dict) -> list[str]:
    """Issue 42's table: what B and G keep beside the v1.37 kubelet stand-in and with ours alone,
    per neighbour, and what the daemon counted of the stand-in's writes in each run."""
    runs = [x for x in r["runs"] if "error" not in x and x["config"] in STANDIN_RUN]
    out = ["| configuration | neighbour | B page cache kept | G anon / page cache kept | OOM kills |"
           " kubelet resets put back (start, containers) | foreign writes | companion mode / kubelet protects |",
           "|---|---|---:|---:|---|---:|---:|---|"]
    for run in sorted(runs, key=lambda x: (PRESSURES.index(x["pressure"]) if x["pressure"] in PRESSURES else 9,
                                           STANDIN_RUN.index(x["config"]))):
        B, G = run["pods"]["B"], run["pods"]["G"]
        c0, c1 = run.get("kubelet_counts_start") or {}, run.get("kubelet_counts_end") or {}
        delta = {k: c1[k] - c0[k] for k in ("resets", "foreign") if k in c0 and k in c1}
        mode = f"{c1['companion']:.0f} / {c1['kubelet_protects']:.0f}" if "companion" in c1 else "—"
        g = f"{cell_kept(G, 'anon')} / {cell_kept(G, 'file')}" if G["alive"] else "**killed**"
        out.append(f"| {run['config']} | {PRESSURE_TEXT[run['pressure']]} | {cell_kept(B, 'file')} | {g} | "
                   f"{kills_str(run)} | {delta.get('resets', '—'):.0f} | {delta.get('foreign', '—'):.0f} | {mode} |"
                   if delta else
                   f"| {run['config']} | {PRESSURE_TEXT[run['pressure']]} | {cell_kept(B, 'file')} | {g} | "
                   f"{kills_str(run)} | — | — | — |")
    return out


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [x for x in r["runs"] if "error" not in x]
    configs = [c for c in dict.fromkeys(x["config"] for x in runs)]
    pressures = [p for p in PRESSURES if any(x["pressure"] == p for x in runs)]
    fig, axes = plt.subplots(1, len(pressures), figsize=(4.2 * len(pressures), 4.4), sharey=True)
    if len(pressures) == 1:
        axes = [axes]
    colors = {"no daemon": "#9e9e9e", "kubelet / Tiered": "#e57373", "effective / None": "#bdbdbd",
              "effective / Tiered": "#64b5f6", CEILING_CFG: "#2e7d32",
              "effective / Hard": "#1565c0", KUBELET_TODAY: "#ffb74d", KUBELET_COMPANION: "#ef6c00"}
    for ax, pr in zip(axes, pressures):
        ys, labels, cols, notes = [], [], [], []
        for cfg in configs:
            run = next((x for x in runs if x["config"] == cfg and x["pressure"] == pr), None)
            if run is None:
                continue
            a, b = kept(run["pods"]["B"], "file")
            ys.append(100 * a / b if b else 0)
            labels.append(cfg.replace(" / ", "\n") + ("\n(default)" if cfg == "effective / Tiered" else ""))
            cols.append(colors.get(cfg, "#777"))
            victims = [k["pod"] for k in run.get("oom_kills") or []]
            who = {"BE": "neighbour", "BN": "neighbour", "G": "GUARANTEED", "B": "BURSTABLE", "B2": "IDLE BURSTABLE"}
            notes.append(("OOM kill:\n" + "\n+ ".join(dict.fromkeys(who.get(v, v) for v in victims))) if victims else "")
        bars = ax.bar(range(len(ys)), ys, color=cols)
        ax.set_xticks(range(len(ys)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylim(0, 150)
        ax.set_yticks(range(0, 101, 20))
        ax.axhline(100, color="#444", lw=0.6, ls=":")
        ax.set_title(f"neighbour {PRESSURE_TEXT[pr]}", fontsize=10)
        for bar, y, note in zip(bars, ys, notes):
            x = bar.get_x() + bar.get_width() / 2
            ax.text(x, y + 2, f"{y:.0f} %", ha="center", fontsize=9, weight="bold")
            if note:
                bad = any(w in note for w in ("GUARANTEED", "BURSTABLE"))
                ax.text(x, y + 12, note, ha="center", va="bottom", fontsize=6.5,
                        color="#b71c1c" if bad else "#555", weight="bold" if bad else "normal")
    axes[0].set_ylabel("Burstable pod's page cache kept (%)")
    fig.suptitle("Does the Burstable pod keep its working set when a neighbour applies pressure?\n"
                 "(kernel 6.1, systemd 252, 1 GiB, no swap; memqos-systemd configurations)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vmbench.common_args(ap)
    ap.add_argument("--plot", metavar="PNG", help="write the plot here (default with --write: docs/protection.png)")
    ap.add_argument("--configs", default="", help="comma-separated configuration names (default: Tiered, Tiered + "
                    "ceiling, Hard; 'all' for every one)")
    ap.add_argument("--pressures", default=",".join(ALL_PRESSURES),
                    help="comma-separated; 'price' (a lone Burstable pod grows on an idle node) runs only when named")
    ap.add_argument("--no-high", action="store_true", help="skip the memory.high test")
    ap.add_argument("--no-footprint", action="store_true", help="skip the daemon's footprint (110 pods)")
    ap.add_argument("--no-lowering", action="store_true",
                    help="skip timing PID 1's SetUnitProperties when MemoryMax goes below a slice's usage")
    ap.add_argument("--render", metavar="JSON", help="only render a saved --json result")
    ap.add_argument("--standin-tables", action="store_true",
                    help="print issue 42's table (the packaged config beside a v1.37 kubelet at its defaults, a "
                    "stand-in, and ours alone; --configs " + repr(",".join(STANDIN_RUN)) + ") of --render's result")
    ap.add_argument("--lever-tables", action="store_true",
                    help="print issue 35's tables (the lever, no swap / swap, the price) of --render's result")
    args = ap.parse_args()
    if args.render:
        saved = json.load(open(args.render))
        result, host, meta = saved["result"], saved["host"], saved["meta"]
        if args.lever_tables or args.standin_tables:
            print("\n".join(lever_tables(result) if args.lever_tables else standin_tables(result)))
            return 0
    else:
        work = vmbench.tmpdir("memqos-bench-protection-")
        try:
            deb, commit, src = vmbench.prepare(args, work)
            meta = {"commit": commit, "machine": vmbench.machine()}
            p = params(args)
            vmbench.log(f"booting the VM ({len(p['configs'])} configurations x {len(p['pressures'])} pressures)")
            results, host = vmbench.run_bench_vm([SCENARIO], deb=deb, timeout=3000, memory="1G,slots=2,maxmem=2G",
                                                 workdir=work, params=p, src_repo=src, keep=args.keep)
            result = vmbench.scenario_output(results, SCENARIO, "protection.json")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        vmbench.log(f"results: {results}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"result": result, "host": host, "meta": meta}, f, indent=1)
    plot_path = args.plot or (os.path.join(os.path.dirname(os.path.abspath(args.write)), "protection.png")
                              if args.write else None)
    if plot_path:
        plot(result, plot_path)
        vmbench.log(f"plot: {plot_path}")
    rel = os.path.relpath(plot_path, os.path.dirname(os.path.abspath(args.write))) if plot_path and args.write else plot_path
    earlier_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), EARLIER)
    earlier = json.load(open(earlier_path)) if os.path.exists(earlier_path) else None
    block = render(result, host, meta, rel, earlier)
    print(block)
    if args.write:
        vmbench.write_section(args.write, MARKER, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
