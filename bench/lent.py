#!/usr/bin/python3
"""Benchmark (issue 35): the protection BestEffort and over-request usage receive under each layout
(memory_recursiveprot lends kubepods.slice's unclaimed protection), and what a process outside
kubepods takes first.

    flock /var/lock/memqos-vm.lock /usr/bin/python3 bench/lent.py --json bench/results/lent.json \
        --write docs/BENCHMARKS.md

One VM boot (tests/e2e/vm.py: Debian bookworm, systemd 252, kernel 6.1, qemu TCG, 1 GiB, no swap),
the .deb built from a clean clone of HEAD (for the planner and effective.py in the guest); the guest
side is bench/scenarios/61-lent.py, the pods and layouts bench/guest/lentcase.py. No daemon runs:
the guest gives the cgroups the planner's values through systemd itself. About 10-15 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "guest"))
import vmbench  # noqa: E402

SCENARIO = "61-lent"
MARKER = "lent"
MIB = 1 << 20
LAYOUTS = ["effective / Tiered", "effective / Tiered + ceiling", "effective / Hard", "kubelet (v1.37)",
           "kubelet (v1.37) + ceiling", "kubelet-1.36"]
LAYOUTS_OFF = ["effective / Tiered", "effective / Hard", "kubelet (v1.37)"]
PODS = ["g", "b", "o", "be"]


def mib(n) -> str:
    return f"{n / MIB:.0f}"


def render(result: dict, host: dict, meta: dict) -> str:
    lines = [f"<!-- {MARKER}:start -->",
             f"Commit {meta['commit']}, {host.get('started', '?')} UTC; host load before/after "
             f"{host.get('load_before', ['?'])[0]}/{host.get('load_after', ['?'])[0]}, wall {host.get('wall_s', '?')} s; "
             f"guest MemTotal {mib(result.get('capacity', 0))} MiB. Pods (MiB of page cache / request): g 80/128 "
             f"(Guaranteed), b 80/256, o 96/32 (Burstable, o beyond its request), be 192 (BestEffort).",
             "",
             "Per pod: **emulated** = effective.py on the kernel's files before the pressure: protected now "
             "(of it lent) → floor (how far reclaim can take it, its lent share shrinking with its usage); "
             "**kernel** = memory.stat `file` before → when the presser stopped, and `low` events.",
             "",
             "| layout | recursiveprot | ceiling | g | b | o | be | kernel: g / b / o / be file (MiB), low events |"
             " presser |",
             "|---|---|---:|---|---|---|---|---|---|"]
    for r in result.get("runs", []):
        if "error" in r:
            lines.append(f"| {r['layout']} | {'on' if r['recursive'] else 'off'} | | | | | | {r['error']} | |")
            continue
        em = r["emulated"]
        cells = [f"{mib(em[n]['protected'])} ({mib(em[n]['lent'])}) → {mib(em[n]['floor'])}" for n in PODS]
        kern = " / ".join(f"{mib(r['before'][n]['file'])}→{mib(r['after'][n]['file'])}" for n in PODS)
        lows = ", ".join(f"{n} {r['after'][n]['low'] - r['before'][n]['low']}" for n in PODS
                         if r['after'][n]['low'] - r['before'][n]['low'])
        tr = r["press"]["trace"]
        press = (f"{tr[-1]['alloc_mib'] if tr else 0} MiB, "
                 + ("stopped at a low event" if r["press"]["stopped"].startswith("low") else
                    f"{r['press']['result'] or r['press']['how']}"))
        ceil = mib(r["ceiling"]) if r.get("ceiling") else "–"
        lines.append(f"| {r['layout']} | {'on' if r['recursive'] else 'off'} | {ceil} | " + " | ".join(cells)
                     + f" | {kern}; low: {lows or 'none'} | {press} |")
    lines.append(f"<!-- {MARKER}:end -->")
    return "\n".join(lines)


def predict(capacity: int) -> str:
    """The emulation alone, from the planned values and the pods' page cache as sized (no VM):
    per layout, each pod's protection now (lent) and floor, with and without memory_recursiveprot."""
    import lentcase
    from memqos_systemd.effective import protection

    lines = [f"Emulated only (effective.py on the planned values; capacity {mib(capacity)} MiB, BestEffort's usage"
             " held to the ceiling where there is one): protected now (of it lent) → floor, MiB.", "",
             "| layout | recursiveprot | g 80/128 | b 80/256 | o 96/32 | be 192 |", "|---|---|---|---|---|---|"]
    for layout in LAYOUTS:
        p = lentcase.planned(layout, capacity)
        usage = {lentcase.leaf(n): spec[3] * MIB for n, spec in lentcase.PODS.items()}
        if p.ceiling:
            usage[lentcase.leaf("be")] = min(usage[lentcase.leaf("be")], p.ceiling.memory_max)
        tree = lentcase.tree_of(p.units, usage)
        for recursive in (True, False):
            e = protection(tree, recursive=recursive)
            cells = [f"{mib(e[lentcase.leaf(n)].protected)} ({mib(e[lentcase.leaf(n)].lent)}) →"
                     f" {mib(lentcase.floor(tree, lentcase.leaf(n), recursive=recursive))}" for n in PODS]
            lines.append(f"| {layout} | {'on' if recursive else 'off'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vmbench.common_args(ap)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--layouts-off", default=",".join(LAYOUTS_OFF),
                    help="layouts run again after remounting cgroup2 without memory_recursiveprot ('' for none)")
    ap.add_argument("--render", metavar="JSON", help="only render a saved --json result")
    ap.add_argument("--predict", metavar="MIB", type=int, help="only print the emulation's table for a node of MIB")
    args = ap.parse_args()
    if args.predict:
        print(predict(args.predict * MIB))
        return 0
    if args.render:
        saved = json.load(open(args.render))
        result, host, meta = saved["result"], saved["host"], saved["meta"]
    else:
        work = vmbench.tmpdir("memqos-bench-lent-")
        try:
            deb, commit, src = vmbench.prepare(args, work)
            meta = {"commit": commit, "machine": vmbench.machine()}
            p = {"layouts": [x for x in args.layouts.split(",") if x],
                 "layouts_off": [x for x in args.layouts_off.split(",") if x]}
            vmbench.log(f"booting the VM ({len(p['layouts'])} + {len(p['layouts_off'])} runs)")
            results, host = vmbench.run_bench_vm([SCENARIO], deb=deb, timeout=1800, memory="1G", workdir=work,
                                                 params=p, src_repo=src, keep=args.keep)
            result = vmbench.scenario_output(results, SCENARIO, "lent.json")
            with open(os.path.join(results, SCENARIO + ".json")) as f:
                checks = json.load(f)
            result["checks"] = [l for l in (checks.get("stdout", "")).splitlines() if l.startswith("CHECK")]
            result["log"] = (checks.get("stderr", "")).splitlines()[-60:]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"result": result, "host": host, "meta": meta}, f, indent=1)
    block = render(result, host, meta)
    print(block)
    for c in result.get("checks", []):
        print(c)
    if args.write:
        vmbench.write_section(args.write, MARKER, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
