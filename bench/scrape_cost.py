#!/usr/bin/python3
"""Benchmark: what one scrape of the daemon's /metrics costs, next to its floor, at 110 and 500
pods, natively and in the e2e VM (issue 28).

    .venv/bin/python bench/scrape_cost.py --native --json bench/results/scrape-native.json
    flock /var/lock/memqos-vm.lock /usr/bin/python3 bench/scrape_cost.py --vm --json bench/results/scrape-vm.json
    python3 bench/scrape_cost.py --render bench/results/scrape-native.json bench/results/scrape-vm.json \\
        --write docs/BENCHMARKS.md

The measuring is bench/guest/scrape_cost.py (its docstring says how): the daemon's side (the real
Metrics and HTTP server, a plan of N pods and their cgroups) and the floor (one process that
reads the same cgroup files and writes as many lines, as long) in turn, R rounds each, in one
run. Natively the cgroup files are regular files in a temporary directory; in the VM
(bench/scenarios/70-scrape.py, one boot, the .deb built from a clean clone of HEAD) they are
real cgroups under /sys/fs/cgroup, read through kernfs, under TCG.

The issue's goals: natively at 110 pods, a scrape's CPU at most 2x the floor's (reading and
writing); in the VM, the part of a scrape beyond the floor's reading at most 2x the floor's
writing; at most 12 series a pod.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(BENCH, "guest"))
sys.path.insert(0, os.path.dirname(BENCH))

MARKER = "scrape-cost"
PODS = [110, 500]
CONFIGS = ["default", "perPod: false", "perUnit: true"]


def native(args) -> dict:
    import scrape_cost

    root = tempfile.mkdtemp(prefix="memqos-scrape-")
    t0 = time.time()
    out = scrape_cost.run(os.path.join(root, "cgroup"), PODS, args.configs.split(","), args.scrapes, args.rounds, False, args.src,
                          log=lambda msg: print(msg, file=sys.stderr, flush=True))
    out.update(where="native", started=time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)) + " UTC",
               load=[round(x, 2) for x in os.getloadavg()], commit=_commit(args.src or os.path.dirname(BENCH)),
               bench_commit=_commit(), machine=_machine())
    return out


def vm(args) -> dict:
    import vmbench

    work = vmbench.tmpdir("memqos-scrape-vm-")
    deb, commit, src = vmbench.prepare(args, work)
    params = {"pods": PODS, "configs": CONFIGS, "scrapes": args.vm_scrapes, "rounds": args.rounds}
    results, host = vmbench.run_bench_vm(["70-scrape"], deb=deb, timeout=2400, memory="1G,slots=2,maxmem=2G", workdir=work,
                                         params=params, src_repo=src, keep=args.keep)
    out = vmbench.scenario_output(results, "70-scrape", "scrape.json")
    out.update(where="vm", host=host, commit=commit, host_python_loop_ms=vmbench.python_loop_ms(),
               machine=vmbench.machine(), started=host["started"])
    return out


def _commit(tree: str = os.path.dirname(BENCH)) -> str:
    import subprocess
    p = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "?"


def _machine() -> dict:
    import platform
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


# ------------------------------------------------------------------ the report

def ms(s: float) -> str:
    return f"{s * 1e3:.2f}" if s < 0.01 else f"{s * 1e3:.1f}"


def judge(r: dict, where: str, read_key: str = "floor_read_s_median") -> tuple[float, str]:
    """(the goal's ratio, its words) for one measurement; with read_key="floor_pread_s_median"
    against a floor that reads as the daemon does (pread on kept descriptors)."""
    read, write, scrape = r[read_key], r["floor_write_s_median"], r["scrape_s_median"]
    if where == "native":
        return scrape / (read + write), "scrape ÷ floor"
    return (scrape - read) / write, "(scrape − floor's reading) ÷ floor's writing"


def render(runs: list[dict]) -> str:
    lines = [f"<!-- {MARKER}:start -->", "#### What a scrape costs: 110 and 500 pods, next to the floor", "",
             "`bench/scrape_cost.py` (the measuring in `bench/guest/scrape_cost.py`): the daemon's side (the real "
             "`Metrics` and its HTTP server, a plan of N pods, one container each, and their cgroups) and the floor "
             "(one process that reads the same cgroup files, open/read/close, and writes as many lines of the same "
             "length over a socket) in turn, R rounds each, in one run; per figure the median of the rounds. The "
             "scraper asks as Prometheus 2.x does (OpenMetrics first, gzip); the page is text 0.0.4, uncompressed. "
             "The daemon reads with `pread` on descriptors kept open between scrapes; the floor's reading that way "
             "is shown too. CPU in ms per scrape.", ""]
    for run in runs:
        where = run.get("where", "native")
        if where == "vm":
            g = run
            tcg = g["python_loop_ms"] / run["host_python_loop_ms"]
            loads = [x for c in run["results"].values() for r in c.values() for x in [r.get("stamp") or {}]]
            host_load = [x.get("host", {}).get("load", ["?"])[0] for x in loads]
            guest_load = [x.get("guest", ["?"])[0] for x in loads]
            lines += [f"**In the VM** (commit {run['commit']}, {run['started']}): real cgroups of the guest's kernel "
                      f"(kernfs) under TCG, about {tcg:.0f}× slower than the host for Python; host load "
                      f"{min(host_load)}–{max(host_load)}, guest load {min(guest_load)}–{max(guest_load)} while "
                      "measuring.", ""]
            kd = run.get("kept_descriptors")
            if kd:
                lines += [f"On this kernel a cgroup whose memory.events is held open is removed all the same "
                          f"(rmdir succeeded: {kd['after_rmdir']}), the held descriptor then fails, and a cgroup "
                          "made again at the same place is read afresh: what the kept descriptors rely on.", ""]
        else:
            lo = [x for c in run["results"].values() for r in c.values() for x in r["load"]]
            lines += [f"**Natively**, the daemon of {run['commit']} (the benchmark of {run.get('bench_commit', run['commit'])}, "
                      f"{run['started']}, {run['machine']['cores']} cores {run['machine']['cpu']}, Python "
                      f"{run['machine']['python']}): the cgroup files as regular files; load average "
                      f"{min(lo):.1f}–{max(lo):.1f} while measuring (a host shared with other sessions).", ""]
        words = judge(next(iter(next(iter(run["results"].values())).values())), where)[1]
        lines += [f"| pods | metrics | lines / KB | series a pod / a node | scrape | floor: read + write | "
                  f"floor's read with pread | render() alone | gzip would add | {words} | the same, the floor "
                  "reading with pread |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n, configs in run["results"].items():
            for name, r in configs.items():
                ratio, pread = judge(r, where)[0], judge(r, where, "floor_pread_s_median")[0]
                lines.append(
                    f"| {n} | {name} | {r['lines']:,} / {r['bytes'] / 1024:.0f} | {r['per_pod']:.0f} / "
                    f"{r['node_series']} | **{ms(r['scrape_s_median'])}** | {ms(r['floor_read_s_median'])} + "
                    f"{ms(r['floor_write_s_median'])} | {ms(r['floor_pread_s_median'])} | {ms(r['render_s_median'])} "
                    f"| {ms(r['gzip_s'])} | {ratio:.2f}× | {pread:.2f}× |")
        d = run["results"].get("110", {}).get("default")
        if d:
            ratio, words = judge(d, where)
            goal = 2.0
            lines += ["", f"Goal at 110 pods ({words} ≤ {goal:g}×): **{ratio:.2f}×**: "
                      + ("**met**" if ratio <= goal else "**not met**") + f"; {d['per_pod']:.0f} series a pod "
                      "(goal ≤ 12): " + ("**met**" if d["per_pod"] <= 12 else "**not met**") + ".", ""]
    lines.append(f"<!-- {MARKER}:end -->")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--native", action="store_true", help="measure natively (regular files)")
    ap.add_argument("--vm", action="store_true", help="measure in the e2e VM (real cgroups; wrap in flock)")
    ap.add_argument("--src", help="natively: the daemon's side imports memqos_systemd from this tree (before/after)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="natively: which metrics settings (of: "
                    + ", ".join(CONFIGS) + "; an older tree --src knows only its default)")
    ap.add_argument("--scrapes", type=int, default=100, help="natively: scrapes per round at 100 pods")
    ap.add_argument("--vm-scrapes", type=int, default=10, help="in the VM: scrapes per round at 100 pods")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--render", nargs="+", metavar="JSON", help="the report of saved results, and exit")
    ap.add_argument("--write", metavar="FILE", help="replace this benchmark's section of FILE")
    ap.add_argument("--json", help="save the raw results here")
    ap.add_argument("--deb", help="in the VM: install this .deb (default: built from a clean clone of HEAD)")
    ap.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        runs = [json.load(open(f)) for f in args.render]
    else:
        if not (args.native or args.vm):
            ap.error("say --native, --vm, or --render")
        runs = ([native(args)] if args.native else []) + ([vm(args)] if args.vm else [])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(runs[0] if len(runs) == 1 else runs, f, indent=1)
    runs = [r for x in runs for r in (x if isinstance(x, list) else [x])]
    text = render(runs)
    print(text)
    if args.write:
        import vmbench
        vmbench.write_section(args.write, MARKER, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
