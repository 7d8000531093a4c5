#!/usr/bin/python3
"""Benchmark: speed and cost of memqos-systemd on a real systemd (the e2e VM), next to the floors.

    /usr/bin/python3 bench/vm_speed.py --write docs/BENCHMARKS.md

One VM boot (tests/e2e/vm.py: Debian bookworm, systemd 252, kernel 6.1, qemu TCG, 2 vCPUs, 1 GiB),
the .deb built from a clean clone of HEAD; the guest side is bench/scenarios/50-speed.py.

(a) reaction: N pod slices created in one burst (pipelined StartTransientUnit); for each, the time
    from its UnitNew to MemoryLow showing in its memory.low, for memqos-systemd (the installed
    service; the kubelet stand-in already lists the pods), the floor (bench/guest/floor_subscriber.py:
    one SetUnitProperties per UnitNew and nothing else), the safe floor (the same with --safe:
    one Unit.SetProperties per JobRemoved, to the run named by the slice's cgroup's invocation ID)
    and a 1 s poll loop (bench/guest/poll_loop.py);
    the kubelet's model (QoS-level values on its 60 s resync) is computed, not waited for.
(b) throughput: converging 110 and 500 pods from nothing: raw SetUnitProperties pipelined on one
    connection (floor), a `systemctl set-property --runtime` loop, and memqos-systemd from the
    kubelet's start (and from the service's own cold start).
(c) steady state with 110 pods and their containers: D-Bus writes per resync (memqos_dbus_calls_total
    before/after), RSS, CPU over an idle interval.

Prints the markdown section; --write replaces it in the document (between vm-speed markers).
Needs what tests/e2e needs (root, qemu, the cached image or debootstrap). Waits while another
qemu-system runs. About 15-20 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vmbench  # noqa: E402

SCENARIO = "50-speed"
MARKER = "vm-speed"
GOAL_P99 = 1.5
GOAL_THROUGHPUT = 1.25
GOAL_RSS = 40 << 20
GOAL_CPU_PCT = 0.1


HISTORY_NOTE = (
    "History: the first runs of this benchmark (at fda1d9d) found the daemon leaving all but one slice of "
    "every burst to its 60 s resync: `Daemon.reconcile` cleared the set of units to re-read after awaiting "
    "the reads, dropping the `UnitNew`/`JobRemoved` events that came in meanwhile. Fixed in cd9c123; the "
    "figures above include the fix when the commit above is later than that.")


def ms(s):
    return f"{s * 1e3:,.0f} ms" if s < 10 else f"{s:,.1f} s"


def secs(s):
    return f"{s:.2f} s"


def verdict(ok):
    return "**met**" if ok else "**not met**"


def render(r: dict, host: dict, meta: dict) -> str:
    g = r["guest"]
    P = r["params"]
    tcg = g["python_loop_ms"] / meta["host_python_loop_ms"]
    L = vmbench.load_str
    lines = [
        f"<!-- {MARKER}:start -->",
        "## Speed and cost on a real systemd (VM)",
        "",
        f"Command: `/usr/bin/python3 bench/vm_speed.py --write docs/BENCHMARKS.md` (one VM boot, "
        f"{host['wall_s'] / 60:.0f} min wall time on {host['started']}). Commit {meta['commit']}.",
        f"Host: {meta['machine']['cores']} cores, {meta['machine']['cpu']}, {meta['machine']['qemu']}; "
        f"load average before/after the run {host['load_before'][0]} / {host['load_after'][0]}.",
        f"Guest: the e2e image (tests/e2e) under TCG, {g['cpus']} vCPUs, {g['mem_total_kib'] // 1024} MiB, "
        f"kernel {g['kernel']}, {g['systemd']}. The guest's CPU is about **{tcg:.0f}× slower** than the "
        f"host's (the same pure-Python loop: {meta['host_python_loop_ms']:.0f} ms on the host, "
        f"{g['python_loop_ms']:.0f} ms in the guest), so absolute times are TCG times: compare the ratios, "
        "which were measured side by side in the same boot.",
        "Every figure is followed by the load average (1 min) of the host and of the guest when it was taken.",
        "",
    ]
    # (a) reaction
    if "reaction" in r:
        rx = r["reaction"]
        fl = rx["floor"]["reaction_s"]
        n = rx["floor"]["n"]
        lines += [
            f"### Reaction: a pod slice's `UnitNew` → its `memory.low` in the kernel ({n} pod slices in one burst)",
            "",
            "The burst: `StartTransientUnit` for every slice from one connection, 32 calls in flight (burst.py; "
            "dbus-next 0.2.3 drops a connection whose send buffer fills, which ~110 calls at once do), "
            f"{'as the issue asks' if n >= 200 else f'{n} instead of the 200 the issue asks for (TCG)'}. "
            "The probe stamps each slice's `UnitNew` as it arrives and reads its `memory.low` every 5 ms "
            "until the value is there (resolution ~5 ms plus one sweep).",
            "",
            "| reactor | p50 | p99 | max | reached | p99 ÷ floor p99 | after the cgroup appeared: p50 / p99 | load (host / guest) |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        labels = [("floor", "floor: one `SetUnitProperties` per `UnitNew`, nothing else"),
                  ("safe_floor", "safe floor: one `Unit.SetProperties` per started slice (`JobRemoved`), to the run"
                                 " its cgroup's invocation ID names"),
                  ("memqos", "**memqos-systemd** (the .deb's service, pods already listed by the kubelet)"),
                  ("poll_1s", "a 1 s poll loop (`ListUnitsByPatterns` + set new ones)")]
        for key, label in labels:
            x = rx.get(key)
            if not x:
                continue
            s = x["reaction_s"]
            ratio = s["p99"] / fl["p99"] if x["done"] else float("nan")
            ac = x.get("after_cgroup_s")
            acs = f"{ms(ac['p50'])} / {ms(ac['p99'])}" if ac else "—"
            lines.append(f"| {label} | {ms(s['p50'])} | {ms(s['p99'])} | {ms(s['max'])} | {x['done']}/{x['n']} | "
                         f"{ratio:.1f}× | {acs} | {L(x['stamp'])} |")
        lines.append(f"| the kubelet's model: QoS-level values on its 60 s resync (computed) | "
                     f"{ms(30 + fl['p50'])} | {ms(59.4 + fl['p99'])} | {ms(60 + fl['max'])} | — | "
                     f"{(59.4 + fl['p99']) / fl['p99']:.0f}× | — | — |")
        ours = rx.get("memqos", {}).get("reaction_s")
        if ours:
            ratio = ours["p99"] / fl["p99"]
            lat = rx["memqos"]["latencies_s"]
            fast = sum(1 for v in lat if v <= 5 * fl["max"])
            lines += ["", f"Goal p99 ≤ {GOAL_P99}× the floor's: {ratio:.1f}× → {verdict(ratio <= GOAL_P99)}. "
                      f"{fast} of {len(lat)} slices got their value within 5× the floor's slowest "
                      f"({ms(5 * fl['max'])}); the others {'only ' if fast < len(lat) else ''}at "
                      f"{ms(min([v for v in lat if v > 5 * fl['max']], default=0))}–{ms(max(lat))}."]
            mq = rx["memqos"]
            cg_ours, cg_floor = mq.get("cgroup_after_unitnew_s"), rx["floor"].get("cgroup_after_unitnew_s")
            if cg_ours and cg_floor:
                lines += ["", f"With memqos-systemd the first slice got its value {ms(min(lat))} after its `UnitNew`, "
                          f"the last {ms(max(lat))}. systemd itself created the slices' cgroups p50 "
                          f"{ms(cg_ours['p50'])} after their `UnitNew` while the daemon worked, against "
                          f"{ms(cg_floor['p50'])} with the floor. Per new slice the daemon sends one call, like "
                          "the floor, but it can only send it once the slice has started: it writes to the run its "
                          "cgroup's invocation ID names, which exists from the start job on, so that a write can "
                          "never re-create a slice deleted meanwhile. The floor writes by name as soon as the slice "
                          "is loaded, before its start job has run, which is the write that leaked slices under "
                          "churn (docs/RELIABILITY.md limit 1). In PID 1 the start jobs and the writes then follow "
                          "each other instead of overlapping (see the summary at the top)."]
            safe = rx.get("safe_floor", {}).get("reaction_s")
            if safe:
                lines += ["", f"Against the safe floor (the least a reactor that waits for the start does): "
                          f"memqos-systemd p99 {ms(ours['p99'])} vs {ms(safe['p99'])}, "
                          f"{ours['p99'] / safe['p99']:.1f}×; p50 {ms(ours['p50'])} vs {ms(safe['p50'])}. "
                          f"The safe floor itself is {safe['p99'] / fl['p99']:.1f}× the floor's p99: what waiting "
                          "for the start costs."]
            lines += ["", HISTORY_NOTE]
        lines += [
            "",
            "How the kubelet's model is computed: the QoS-level values (`kubepods.slice`, "
            "`kubepods-burstable.slice`), which bound what any pod's protection is worth, are written by the "
            "kubelet's periodic `UpdateCgroups` every 60 s. A burst landing at a uniformly random phase of "
            "that timer waits U(0, 60 s): p50 30 s, p99 59.4 s, max 60 s; one write (the floor's measured "
            "reaction) is added. Waiting for it in the VM would only measure the timer. Caveat: the kubelet also "
            "calls `UpdateQOSCgroups` from `syncPod` just before it creates a new pod's cgroup, so for pod "
            "*creation* its QoS values can follow sooner; the 60 s figure is the model the issue names (and "
            "what covers every change that does not create a pod cgroup). In the KEP's layout those values "
            "do not protect Burstable pods at all (see the protection benchmark).",
            "",
        ]
    # (b) throughput
    if r.get("throughput"):
        lines += [
            "### Throughput: converging a node from nothing",
            "",
            "N Burstable pod slices run with nothing set; converged = `MemoryLow` of every pod slice, of "
            "`kubepods-burstable.slice` and of `kubepods.slice` (N + 2 writes) in the kernel's files. "
            "Floor: raw `SetUnitProperties` from one connection, pipelined with 32 calls in flight. "
            "memqos-systemd: the service runs while the kubelet is down; timed from the kubelet's start job "
            "ending (its `/pods` answers) to the last value in the kernel, so it includes re-reading every "
            "unit, fetching and planning N pods. Cold start: `systemctl start memqos-systemd` on a node whose "
            "kubelet lists the pods, until READY=1 (sent after the first reconcile), Python start-up included. "
            "The shipped unit's TimeoutStartSec=60s is raised to 600 s in the guest for this benchmark: under TCG "
            "the first reconcile of 500 pods takes longer than 60 s, and systemd killed the daemon in the first "
            "run (on a real CPU the same work is about the TCG factor above shorter).",
            "",
            "| pods | floor (pipelined) | `systemctl set-property` loop | **memqos-systemd** (kubelet start → converged) "
            "| memqos ÷ floor | goal ≤ 1.25× | memqos cold start | memqos: unit reads + writes as its metrics count them | load (host / guest) |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---|",
        ]
        for t in r["throughput"]:
            f, sh, o, c = t["floor"], t["systemctl_loop"], t["memqos"], t["memqos_cold_start"]
            cold = secs(c["ready_s"]) if "failed" not in c else f"failed after {secs(c['ready_s'])}"
            ratio = o["kernel_s"] / f["kernel_s"]
            # one counted read = GetUnit + Get(LoadState) + GetAll; a pod write = GetUnit + 2 Get + Set
            msgs = f" (≈ {3 * o['reads'] + 4 * o['writes'] - 6:,.0f} D-Bus calls)"
            lines.append(
                f"| {t['n']} | {secs(f['kernel_s'])} | {secs(sh['kernel_s'])} ({sh['kernel_s'] / f['kernel_s']:.1f}×) | "
                f"{secs(o['kernel_s'])} | {ratio:.2f}× | {verdict(ratio <= GOAL_THROUGHPUT)} | "
                f"{cold} | {o['reads']:.0f} + {o['writes']:.0f}{msgs} | "
                f"floor {L(f['stamp'])}; memqos {L(o['stamp'])} |")
        lines.append("")
    # (c) steady state
    if "steady" in r:
        s = r["steady"]
        idle, rs, rss = s["idle"], s["resync"], s["rss"]
        wpr = rs["writes"] / rs["resyncs"] if rs["resyncs"] else float("nan")
        native_pct = idle["cpu_pct_of_core"] / tcg
        top = sorted(idle.get("threads_cpu_s", {}).items(), key=lambda kv: -kv[1])[:4]
        threads = ", ".join(f"{k.split(' ', 1)[1]} {v:.1f} s" for k, v in top)
        quarters = ", ".join(f"{w:.1f} %" for w in idle.get("window_pct", []))
        by_method = ", ".join(f"{k} {v:.0f}" for k, v in idle.get("calls_by_method", {}).items())
        others = " and ".join(f"{v:.1f} s" for v in idle.get("others_cpu_s", {}).values())
        # `reads` counts every call but the writes: each resync's ListUnitsByPatterns (counted as
        # `resyncs`) and the GetAll of every unit it then reads.
        getall = (rs["reads"] - rs["resyncs"]) / rs["resyncs"] if rs["resyncs"] else 0.0
        lines += [
            f"### Steady state: {s['pods']} pods with one running container each, nothing changing",
            "",
            "| figure | measured | goal | verdict | load (host / guest) |",
            "|---|---:|---|---|---|",
            f"| D-Bus writes per resync (`memqos_dbus_calls_total{{method=\"SetUnitProperties\"}}` before/after "
            f"{rs['resyncs']:.0f} resyncs run back to back, `resyncInterval: 1s`, {rs['window_s']} s) | "
            f"{rs['writes']:.0f} in {rs['resyncs']:.0f} ({wpr:.2f} per resync) | 0 | {verdict(rs['writes'] == 0)} | "
            f"{L(rs['stamp'])} |",
            f"| what a resync reads over D-Bus ({rs['units']} units of ours; every 15th resync lists them all) | one "
            f"ListUnitsByPatterns and {getall:.2f} GetAll per resync | — | — | {L(rs['stamp'])} |",
            f"| writes during the idle interval ({idle['seconds']:.0f} s at the defaults: {idle['reconciles']:.0f} "
            f"reconciles, {idle['resyncs']:.0f} resyncs) | {idle['writes']:.0f} | 0 | "
            f"{verdict(idle['writes'] == 0)} | {L(idle['stamp'])} |",
            f"| RSS of the daemon (VmRSS; PSS {rss.get('Pss', 0) / 2**20:.1f} MiB, anonymous "
            f"{rss.get('RssAnon', 0) / 2**20:.1f} MiB) | {rss['VmRSS'] / 2**20:.1f} MiB | ≤ 40 MiB | "
            f"{verdict(rss['VmRSS'] <= GOAL_RSS)} | {L(rss['stamp'])} |",
            f"| CPU while idle, in the guest ({idle['cpu_s']:.2f} s over {idle['seconds']:.0f} s, i.e. "
            f"{idle['cpu_s_per_hour']:.0f} CPU s per hour; by quarter: "
            f"{quarters}) | {idle['cpu_pct_of_core']:.2f} % of a core | "
            f"≤ 0.1 % | {verdict(idle['cpu_pct_of_core'] <= GOAL_CPU_PCT)} (TCG) | {L(idle['stamp'])} |",
            f"| the same divided by the TCG factor ({tcg:.0f}×): an estimate for a real CPU | "
            f"{native_pct:.2f} % ({idle['cpu_s_per_hour'] / tcg:.0f} CPU s per hour) | ≤ 0.1 % | "
            f"{verdict(native_pct <= GOAL_CPU_PCT)} (estimate) | — |",
            "",
            f"At the defaults the daemon asks the kubelet for its pods every 5 s (`pollInterval`; an unchanged "
            f"answer is not planned again), re-reads the node, QoS and reserved slices every 60 s "
            f"(`resyncInterval`) and every unit every 15th time (over D-Bus only the units whose cgroup does not "
            f"show the cached values); the cgroups' `memory.events` are read only when scraped. During the idle "
            f"interval it made {idle['calls']:.0f} counted D-Bus calls "
            f"({by_method}), its reconciles "
            f"took {idle.get('reconcile_s_sum', 0):.1f} s in all, and the CPU by thread was "
            f"{threads}; "
            f"systemd and dbus-daemon used {others} "
            f"in the same interval. The service cgroup's `memory.current` (page cache included) was "
            f"{(s.get('service_memory_current') or 0) / 2**20:.1f} MiB.",
            "",
        ]
    lines += [
        "What TCG distorts, and what was not measured here: every CPU-bound time in the guest (the daemon's "
        "Python, systemd, dbus-daemon) is about the factor above slower than on real hardware, but they are "
        "slowed alike, so the ratios hold better than the absolute times; the floor's own cost is mostly "
        "systemd's (as in the issue's hand run). The idle-CPU goal is judged on the guest's figure, with the "
        "native estimate beside it; an estimate is not a measurement. The RSS is not distorted by TCG.",
        f"<!-- {MARKER}:end -->",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vmbench.common_args(ap)
    ap.add_argument("--reaction-pods", type=int, default=200)
    ap.add_argument("--throughput-pods", default="110,500")
    ap.add_argument("--idle", type=int, default=120, help="seconds of the idle CPU interval")
    ap.add_argument("--resync-window", type=int, default=90, help="seconds of back-to-back resyncs counted")
    ap.add_argument("--phases", default="reaction,throughput,steady")
    ap.add_argument("--render", metavar="JSON", help="only render a saved --json result")
    args = ap.parse_args()
    if args.render:
        saved = json.load(open(args.render))
        block = render(saved["result"], saved["host"], saved["meta"])
    else:
        params = {"reaction_pods": args.reaction_pods, "reaction_timeout": 180,
                  "throughput_pods": [int(x) for x in args.throughput_pods.split(",") if x],
                  "steady_pods": 110, "idle_s": args.idle, "idle_windows": 4, "settle_s": 30,
                  "resync_window_s": args.resync_window, "phases": args.phases.split(",")}
        work = vmbench.tmpdir("memqos-bench-speed-")
        try:
            deb, commit, src = vmbench.prepare(args, work)
            meta = {"commit": commit, "machine": vmbench.machine(), "host_python_loop_ms": vmbench.python_loop_ms()}
            vmbench.log(f"booting the VM ({params})")
            results, host = vmbench.run_bench_vm([SCENARIO], deb=deb, timeout=1500, memory="1G,slots=2,maxmem=2G",
                                                 workdir=work, params=params, src_repo=src, keep=args.keep)
            result = vmbench.scenario_output(results, SCENARIO, "speed.json")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        vmbench.log(f"results: {results}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"result": result, "host": host, "meta": meta}, f, indent=1)
        block = render(result, host, meta)
    print(block)
    if args.write:
        vmbench.write_section(args.write, MARKER, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
