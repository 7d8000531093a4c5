"""Host side shared by the VM benchmarks (bench/vm_speed.py, bench/protection.py).

They reuse the e2e harness as it is (tests/e2e/vm.py: build_image, build_payload, run_vm) and
bring their own guest scenarios from bench/scenarios/ and guest helpers from bench/guest/:
build_payload() copies tests/e2e's scenarios, which are replaced in the payload by ours, so
nothing under tests/e2e/ is edited or run.

What is measured is the committed HEAD: the .deb is built from a fresh clone of the repository
(not from the shared work tree, where others' uncommitted edits live), unless --deb names one.
Before a VM boots we wait while another qemu-system process runs (a second TCG guest on the
same 2 cores would distort every figure), and the guest asks the host for its load average
(and whether another qemu appeared meanwhile) next to every figure it measures.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
import vm as e2e_vm  # noqa: E402  (the e2e harness, used as is)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def other_qemus(exclude: str | None = None) -> list[int]:
    """PIDs of qemu-system processes (those whose command line mentions `exclude` left out)."""
    p = subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, text=True)
    pids = []
    for tok in p.stdout.split():
        pid = int(tok)
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "qemu-system" not in cmd.split(" ", 1)[0] and not cmd.startswith("qemu-system"):
            continue  # pgrep -f also matches shells whose arguments mention qemu-system
        if exclude and exclude in cmd:
            continue
        pids.append(pid)
    return pids


def wait_for_quiet_host(max_wait: float = 3600, poll: float = 10) -> float:
    """Wait while another qemu-system process runs; return the seconds waited."""
    t0 = time.monotonic()
    announced = False
    while other_qemus():
        if not announced:
            log(f"another qemu-system is running ({other_qemus()}); waiting for it to finish")
            announced = True
        if time.monotonic() - t0 > max_wait:
            raise SystemExit(f"another qemu-system kept running for {max_wait:.0f} s; giving up")
        time.sleep(poll)
    waited = time.monotonic() - t0
    if announced:
        log(f"host quiet after {waited:.0f} s")
    return waited


def build_deb_from_head(workdir: str) -> tuple[str, str, str]:
    """Clone the repository's HEAD into workdir and build the .deb there (build-time tests off:
    the suite runs elsewhere). Returns (deb path, commit, clone directory)."""
    src = os.path.join(workdir, "src")
    subprocess.run(["git", "clone", "-q", REPO, src], check=True)
    commit = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    env = dict(os.environ, DEB_BUILD_OPTIONS="nocheck")
    with open(os.path.join(workdir, "build-deb.log"), "w") as logf:
        p = subprocess.run(["bash", "scripts/build-deb.sh"], cwd=src, stdout=logf, stderr=subprocess.STDOUT,
                           env=env)
    if p.returncode != 0:
        raise SystemExit(f"building the .deb failed; see {workdir}/build-deb.log")
    debs = [os.path.join(src, "build", "deb", f) for f in os.listdir(os.path.join(src, "build", "deb"))
            if f.endswith(".deb")]
    return debs[0], commit, src


def machine() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "qemu": qemu,
            "python": platform.python_version()}


def python_loop_ms() -> float:
    """The TCG reference: the same pure-Python loop runs here and in the guest (guest/mqbench.py);
    their ratio is how much slower the guest's CPU is."""
    import statistics
    code = "s = 0\nfor i in range(300000):\n    s += i * i\n"
    times = []
    for _ in range(7):
        t = time.perf_counter()
        exec(code, {})
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def run_bench_vm(scenarios: list[str], *, deb: str | None, timeout: int, memory: str,
                 workdir: str, params: dict, src_repo: str | None = None,
                 keep: bool = False) -> tuple[str, dict]:
    """Boot the e2e guest with our scenarios (bench/scenarios/<name>.py) and guest helpers
    (bench/guest/ -> payload/bench/); return (results dir, host info sampled around the run)."""
    image = e2e_vm.build_image()
    payload = os.path.join(workdir, "payload")
    e2e_vm.build_payload(payload, scenarios=scenarios, debs=[deb] if deb else [], repo=src_repo or REPO)
    # Our scenarios replace the harness's: only what bench/ brings runs.
    shutil.rmtree(os.path.join(payload, "scenarios"))
    os.makedirs(os.path.join(payload, "scenarios"))
    for name in scenarios:
        shutil.copy(os.path.join(BENCH, "scenarios", name + ".py"), os.path.join(payload, "scenarios"))
    shutil.copytree(os.path.join(BENCH, "guest"), os.path.join(payload, "bench"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    with open(os.path.join(payload, "run.json"), "w") as f:
        json.dump({"scenarios": scenarios, "default_timeout": timeout}, f)
    with open(os.path.join(payload, "bench", "params.json"), "w") as f:
        json.dump(params, f)

    samples = []

    def host_info(vm, msg):
        # Asked by the guest next to every figure it measures.
        others = other_qemus(exclude=vm.run_dir)
        info = {"load": [round(x, 2) for x in os.getloadavg()], "other_qemu": len(others),
                "t": round(time.time(), 1)}
        samples.append(dict(info, what=msg.get("what", "")))
        return info

    wait_for_quiet_host()
    host = {"load_before": [round(x, 2) for x in os.getloadavg()], "started": time.strftime("%Y-%m-%d %H:%M")}
    t0 = time.monotonic()
    try:
        results = e2e_vm.run_vm(payload, timeout + 400, memory=memory, image=image,
                                handlers={"bench-host": host_info}, keep=keep or None)
    except e2e_vm.VMError as e:
        raise SystemExit(f"the VM run failed: {e}")
    host.update(wall_s=round(time.monotonic() - t0, 1), load_after=[round(x, 2) for x in os.getloadavg()],
                samples=samples)
    with open(os.path.join(os.path.dirname(results), "timing.json")) as f:
        host["timing"] = json.load(f)
    return results, host


def scenario_output(results: str, name: str, artifact: str) -> dict:
    """The JSON our scenario saved as an artifact; the scenario's log tail if it is missing."""
    path = os.path.join(results, name + ".artifacts", artifact)
    if not os.path.exists(path):
        try:
            with open(os.path.join(results, name + ".json")) as f:
                r = json.load(f)
            tail = "\n".join((r.get("stdout", "") + "\n" + r.get("stderr", "")).splitlines()[-40:])
            status = r.get("status")
        except OSError:
            tail, status = "", "missing"
        raise SystemExit(f"{name}: no {artifact} (status {status}); results in {results}\n{tail}")
    with open(path) as f:
        return json.load(f)


def write_section(doc_path: str, marker: str, block: str) -> None:
    """Replace <!-- marker:start --> ... <!-- marker:end --> in doc_path (append if absent)."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    try:
        doc = open(doc_path).read()
    except FileNotFoundError:
        doc = "# Benchmarks\n\n"
    if start in doc:
        doc = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(doc_path, "w") as f:
        f.write(doc)


def common_args(ap) -> None:
    ap.add_argument("--write", metavar="FILE", help="replace this benchmark's section of FILE (docs/BENCHMARKS.md)")
    ap.add_argument("--deb", help="install this .deb (default: build one from a clean clone of HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the VM's overlay and share images")
    ap.add_argument("--json", metavar="FILE", help="also save the raw results here")


def prepare(args, workdir: str) -> tuple[str, str, str | None]:
    """(deb, commit, source repo for the payload) per --deb or a fresh build of HEAD."""
    if args.deb:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() + " (work tree; .deb given with --deb)"
        return os.path.abspath(args.deb), commit, None
    log("building the .deb from a clean clone of HEAD")
    deb, commit, src = build_deb_from_head(workdir)
    return deb, commit, src


def load_str(sample: dict | None) -> str:
    """'host 1.2 / guest 0.8' for a figure's table cell."""
    if not sample:
        return "?"
    h = sample.get("host") or {}
    g = sample.get("guest")
    s = f"host {h.get('load', ['?'])[0]}"
    if g is not None:
        s += f" / guest {g[0]}"
    if h.get("other_qemu"):
        s += " (another qemu ran!)"
    return s


def tmpdir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)
