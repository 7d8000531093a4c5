#!/usr/bin/python3
"""Benchmark (issue 35): the protection BestEffort and over-request usage receive under each layout
(memory_recursiveprot lends kubepods.slice's unclaimed protection), and what a process outside
kubepods takes first.

    flock /var/lock/memqos-vm.lock /usr/bin/python3 bench/lent.py --json bench/results/lent.json \
        --write docs/BENCHMARKS.md

One VM boot (tests/e2e/vm.py: Debian bookworm, systemd 252, kernel 6.1, qemu TCG, 1 GiB, no swap),
the .deb built from a clean clone of HEAD (for the planner and effective.py in the guest); the guest
side is bench/scenarios/61-lent.py, the pods and layouts bench/guest/lentcase.py. No daemon runs:
the guest gives the cgroups the planner's values through systemd itself. At most about 25 minutes:
each run's presser ends in 120 s at most (bench/guest/press.py says why it stopped) and the guest
starts no run after 20 minutes, the runs that matter first (lentcase.run_order).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # memqos_systemd, for --predict
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


STOPS = {"low": "a `low` event", "floors": "floors reached, +16 MiB", "thrashing": "thrashing", "time": "time bound",
         "cap": "cap"}


def press_cell(p: dict) -> str:
    """How the presser ended, for the table: its own reason, else systemd's result (an OOM kill)."""
    # the trace's last step (the saved alloc_mib read 0 in 82eaf97's presser: taken after the free)
    alloc = p["trace"][-1]["alloc_mib"] if p.get("trace") else p.get("alloc_mib", 0)
    if p.get("stopped") in STOPS:
        why = STOPS[p["stopped"]]
        th = p.get("thrash")
        if p["stopped"] == "thrashing" and th:
            # PSI's total and the guest's clock disagree under TCG: its seconds, not a share
            psi = "" if th.get("stall") is None else f", PSI some +{th['stall'] * th['window_s']:.1f} s"
            last = f", last step {th['step_s']} s" if th.get("step_s") is not None else ""
            why += f" ({th['refault_pages'] * 4 // 1024} MiB refaulted in {th['window_s']} s{psi}{last})"
        elif p.get("floors_at_mib") is not None and p["stopped"] != "floors":
            why += f" (floors reached at {p['floors_at_mib']} MiB)"
        return f"{why}; {alloc} MiB in {p.get('seconds', '?')} s"
    return f"{p.get('result') or p.get('how')} ({p.get('stopped')}); {alloc} MiB"


def order(r: dict) -> tuple:
    return (not r["recursive"], LAYOUTS.index(r["layout"]) if r["layout"] in LAYOUTS else len(LAYOUTS))


def render(result: dict, host: dict, meta: dict) -> str:
    import lentcase

    lines = [f"<!-- {MARKER}:start -->",
             f"Commit {meta['commit']}, {host.get('started', '?')} UTC; host load before/after "
             f"{host.get('load_before', ['?'])[0]}/{host.get('load_after', ['?'])[0]}, wall {host.get('wall_s', '?')} s; "
             f"guest MemTotal {mib(result.get('capacity', 0))} MiB. Pods (MiB of page cache / request): g 80/128 "
             f"(Guaranteed), b 80/256, o 96/32 (Burstable, o beyond its request), be 192 (BestEffort).",
             "",
             "Per pod: **emulated** = effective.py on the kernel's files before the pressure: protected now "
             "(of it lent) → floor (how far reclaim can take it, its lent share shrinking with its usage); "
             "**kernel** = memory.stat `file` before → when the presser stopped, and `low` events; "
             "**agrees** = every pod passes lentcase.verdict (protected whole by the emulation: loses ≤ 8 MiB; "
             "partly: keeps ≥ its floor − 8 MiB).",
             "",
             "| layout | recursiveprot | ceiling | g | b | o | be | kernel: g / b / o / be file (MiB), low events |"
             " presser | agrees |",
             "|---|---|---:|---|---|---|---|---|---|---|"]
    cases = []
    for r in sorted(result.get("runs", []), key=order):
        rp = "on" if r["recursive"] else "off"
        if "error" in r:
            lines.append(f"| {r['layout']} | {rp} | | | | | | {r['error']} | | not run |")
            cases.append(f"{r['layout']}, recursiveprot {rp}: not measured ({r['error']})")
            continue
        em = r["emulated"]
        cells = [f"{mib(em[n]['protected'])} ({mib(em[n]['lent'])}) → {mib(em[n]['floor'])}" for n in PODS]
        kern = " / ".join(f"{mib(r['before'][n]['file'])}→{mib(r['after'][n]['file'])}" for n in PODS)
        lows = ", ".join(f"{n} {r['after'][n]['low'] - r['before'][n]['low']}" for n in PODS
                         if r['after'][n]['low'] - r['before'][n]['low'])
        ooms = ", ".join(f"{n} {r['after'][n]['oom_kill'] - r['before'][n]['oom_kill']}" for n in PODS
                         if r['after'][n]['oom_kill'] - r['before'][n]['oom_kill'])
        verdicts = {n: lentcase.verdict(em[n], r["before"][n]["file"], r["after"][n]["file"]) for n in PODS}
        bad = [f"{n}: {seen}" for n, (ok, seen) in verdicts.items() if not ok]
        ceil = mib(r["ceiling"]) if r.get("ceiling") else "–"
        lines.append(f"| {r['layout']} | {rp} | {ceil} | " + " | ".join(cells)
                     + f" | {kern}; low: {lows or 'none'}{'; OOM kills: ' + ooms if ooms else ''}"
                     + f" | {press_cell(r['press'])} | {'**no**' if bad else 'yes'} |")
        # Whether the pressure reached what the emulation says reclaim may take (else the kernel kept
        # more than the floor, which the checks do not rule out).
        short = [f"{n} {mib(r['after'][n]['file'])} > floor {mib(em[n]['floor'])} + 8" for n in PODS
                 if em[n]["floor"] < em[n]["usage"] and r["after"][n]["file"] > em[n]["floor"] + lentcase.TOLERANCE]
        cases.append(f"{r['layout']}, recursiveprot {rp}: " + ("agreed" if not bad else "**disagreed**: "
                     + "; ".join(bad)) + (f" (not pressed down to the floor: {', '.join(short)})" if short else ""))
    lines += ["", "Cases (each a layout in one boot, the kernel against the emulation):", ""]
    lines += [f"- {c}" for c in cases]
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
    ap.add_argument("--press-s", type=int, default=120, help="the presser's time bound per run (default 120 s)")
    ap.add_argument("--budget-s", type=int, default=1200,
                    help="the guest starts no run after this many seconds (default 1200; the rest is reported)")
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
        import lentcase

        unknown = [x for x in (args.layouts + "," + args.layouts_off).split(",") if x and x not in lentcase.LAYOUTS]
        if unknown:
            ap.error(f"unknown layout(s): {', '.join(unknown)} (known: {', '.join(lentcase.LAYOUTS)})")
        runs = lentcase.run_order([x for x in args.layouts.split(",") if x],
                                  [x for x in args.layouts_off.split(",") if x])
        work = vmbench.tmpdir("memqos-bench-lent-")
        try:
            deb, commit, src = vmbench.prepare(args, work)
            meta = {"commit": commit, "machine": vmbench.machine()}
            p = {"runs": runs, "press_s": args.press_s, "budget_s": args.budget_s}
            vmbench.log(f"booting the VM ({len(runs)} runs)")
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
