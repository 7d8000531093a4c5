"""End-to-end tests: one VM boot runs every guest scenario; one pytest test per scenario.

    python3 -m pytest tests/e2e -v                 # all scenarios (one VM)
    python3 -m pytest tests/e2e -v -k smoke        # only the selected scenarios boot in the VM

Without qemu/debootstrap/root the tests are skipped, or fail when CI=true. See README.md.
"""
import contextlib
import json
import os
import re
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vm as e2e_vm  # noqa: E402
from prereq import require

pytestmark = pytest.mark.e2e

SCENARIOS = e2e_vm.list_scenarios()
TIMEOUT_RE = re.compile(r"^#\s*e2e-timeout:\s*(\d+)\s*$")


def _unavailable(reason):
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e prerequisites missing (CI=true): {reason}", pytrace=False)
    pytest.skip(reason)


def _scenario_timeout(name):
    for ext in (".sh", ".py"):
        path = os.path.join(HERE, "scenarios", name + ext)
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                for _, line in zip(range(30), f):
                    m = TIMEOUT_RE.match(line.strip())
                    if m:
                        return int(m.group(1))
    return 300


def _selected(session):
    names = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if callspec and item.module.__name__ == __name__ and "scenario" in callspec.params:
            if callspec.params["scenario"] not in names:
                names.append(callspec.params["scenario"])
    return names  # (MEMQOS_E2E_SCENARIOS deselects the others: conftest.py)


@pytest.fixture(scope="session")
def e2e_run(request):
    """Build/reuse the image, boot one VM with the selected scenarios; returns
    {'results': dir or None, 'error': str or None, 'selected': [names]}."""
    try:
        cached = e2e_vm.image_is_cached()
    except Exception as e:
        cached = False
        _ = e
    missing = e2e_vm.missing_prerequisites(need_build=not cached)
    if missing:
        _unavailable("; ".join(missing))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    started = []

    def say(msg):
        # Past pytest's output capture (which would keep these lines until the run ends, or for
        # ever): `make test` shows them as they come, on lines of their own.
        if not reporter:
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if not started:
                reporter.write("\n")
                started.append(True)
            reporter.write_line(f"[e2e] {msg}")

    def on_serial_line(line):
        # The guest driver's line for each finished scenario (run-scenarios, say()).
        m = e2e_vm.FINISHED_RE.search(line)
        if m:
            say(m.group(1))

    selected = _selected(request.session)
    if not cached:
        say("building the guest image (about 1.5 minutes, cached afterwards)")
    try:
        image = e2e_vm.build_image()
    except e2e_vm.VMError as e:
        _unavailable(f"could not build the guest image: {e}")
    timeout = int(os.environ.get("MEMQOS_E2E_TIMEOUT", 0)) or (
        240 + sum(_scenario_timeout(n) for n in selected))
    with tempfile.TemporaryDirectory(prefix="mqe2e-payload-") as payload:
        e2e_vm.build_payload(payload, scenarios=selected)
        debs = sorted(os.listdir(os.path.join(payload, "debs"))) \
            if os.path.isdir(os.path.join(payload, "debs")) else []
        say(f"booting the VM for {len(selected)} scenario(s), debs: {debs or 'none'}, "
            f"timeout {timeout} s")
        try:
            results = e2e_vm.run_vm(payload, timeout, image=image, on_serial_line=on_serial_line)
            error = None
        except e2e_vm.VMError as e:
            results, error = e.results_dir, str(e)
    run_dir = os.path.dirname(results) if results else None
    if run_dir:
        say(f"run directory: {run_dir}")
        try:
            with open(os.path.join(run_dir, "timing.json")) as f:
                say(f"timing: {json.load(f)}")
        except OSError:
            pass
    if error:
        say(f"VM error: {error.splitlines()[0]}")
    return {"results": results, "error": error, "selected": selected}


# Scenarios that failed in the last full run on real systemd, with what is known. Not strict:
# a pass shows as XPASS, and the marker should then go. Each is listed in the issue notes.
KNOWN_FAILING: dict[str, str] = {  # scenario -> why it is expected to fail (non-strict xfail)
}


@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=pytest.mark.xfail(reason=KNOWN_FAILING[s], strict=False)) if s in KNOWN_FAILING else s
    for s in SCENARIOS])
def test_scenario(e2e_run, scenario, capsys):
    results = e2e_run["results"]
    path = os.path.join(results, scenario + ".json") if results else None
    if not path or not os.path.exists(path):
        partial = ""
        log = os.path.join(results, scenario + ".log") if results else None
        if log and os.path.exists(log):  # it was running when the VM died or timed out
            with open(log, errors="replace") as f:
                partial = "\n--- its output so far ---\n" + "\n".join(f.read().splitlines()[-40:])
        pytest.fail(f"no result for {scenario}: {e2e_run['error'] or 'not run'}{partial}",
                    pytrace=False)
    with open(path) as f:
        r = json.load(f)
    lines = [f"CHECK {'ok' if c['ok'] else 'fail'} {c['what']}" for c in r["checks"]]
    with capsys.disabled():
        print()
        for line in lines:
            print(f"    {line}")
    # Also in the captured output, so a failure report shows them with the scenario's output.
    print("\n".join(lines))
    print(f"--- {scenario} stdout ---\n{r.get('stdout', '')}")
    print(f"--- {scenario} stderr ---\n{r.get('stderr', '')}")
    if r.get("daemon_journal"):
        print(f"--- {scenario}: memqos-systemd's journal meanwhile (failed scenarios only) ---\n{r['daemon_journal']}")
    if r["status"] == "skipped":
        # A scenario skips when the guest lacks something it needs; in CI that is a failure.
        require(False, f"{scenario}: {r.get('skip_reason') or 'scenario exited 77'}")
    failed = [c["what"] for c in r["checks"] if not c["ok"]]
    problems = []
    if r["timed_out"]:
        problems.append(f"timed out after {r.get('timeout')} s")
    elif r["exit_code"] != 0:
        problems.append(f"exit code {r['exit_code']}")
    if failed:
        problems.append(f"{len(failed)} CHECK fail: " + "; ".join(failed))
    if r["status"] == "error":
        problems.append(r.get("stderr", "driver error"))
    if problems:
        tail = "\n".join((r.get("stderr") or r.get("stdout") or "").splitlines()[-30:])
        pytest.fail(f"{scenario}: " + ", ".join(problems) + (f"\n{tail}" if tail else ""),
                    pytrace=False)


def test_payload_debs_installed(e2e_run):
    """The .deb files of the payload (build/deb/*.deb) installed offline in the guest."""
    results = e2e_run["results"]
    path = os.path.join(results, "install.json") if results else None
    if not path or not os.path.exists(path):
        pytest.fail(f"no install.json: {e2e_run['error']}", pytrace=False)
    with open(path) as f:
        info = json.load(f)
    if not info["debs"]:
        require(False, "no .deb in the payload (make deb puts it in build/deb/)")
    bad = [d for d in info["debs"] if not d["ok"]]
    for d in info["debs"]:
        print(f"{d['deb']}: {'ok' if d['ok'] else 'FAILED'} with {d['method']} in {d['seconds']} s")
    if bad:
        pytest.fail("not installed: " + ", ".join(d["deb"] for d in bad) + "\n"
                    + "\n".join(e for d in bad for e in d.get("errors", []))[-3000:],
                    pytrace=False)
    fallback = [d["deb"] for d in info["debs"] if d["method"] != "apt-get"]
    if fallback:
        pytest.fail(f"apt-get refused {fallback} offline (dpkg -i worked): a Depends is missing "
                    "from tests/e2e/image/packages.txt", pytrace=False)
