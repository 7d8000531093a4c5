"""Fast host-side checks of the e2e harness itself (no VM): the guest driver's result contract
and the payload layout. They run wherever python3 does, so the harness cannot rot silently."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vm as e2e_vm  # noqa: E402

SCENARIOS = {
    "00-pass.sh": "echo CHECK ok first thing\necho 'CHECK ok second thing'\necho err >&2\n",
    "01-checkfail.sh": "echo CHECK ok fine\necho CHECK fail broken thing\nexit 0\n",
    "02-exit.py": "import sys\nprint('CHECK ok python works')\nsys.exit(3)\n",
    "03-skip.sh": "echo SKIP no deb here\nexit 77\n",
    "04-hang.sh": "# e2e-timeout: 2\necho CHECK ok before hang\nsleep 60\n",
    "05-env.sh": ("[ -n \"$MEMQOS_E2E_RESULTS\" ] && [ -d \"$MEMQOS_E2E_ARTIFACTS\" ] && "
                  "[ \"$MEMQOS_E2E_SCENARIO\" = 05-env ] && echo CHECK ok env\n"
                  ". \"$MEMQOS_E2E_GUEST/lib.sh\"\ncheck_eq answer 42 42\n"
                  "check_eq wrong 1 2\n"),
    "README.txt": "not a scenario\n",
}


def run_driver(tmp_path):
    payload = tmp_path / "payload"
    (payload / "scenarios").mkdir(parents=True)
    for name, body in SCENARIOS.items():
        (payload / "scenarios" / name).write_text(body)
    os.symlink(os.path.join(HERE, "guest"), payload / "guest")
    (payload / "run.json").write_text(json.dumps({"cleanup": False}))
    results = tmp_path / "results"
    p = subprocess.run([sys.executable, os.path.join(HERE, "guest", "run-scenarios"),
                        "--payload", str(payload), "--results", str(results)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, MEMQOS_E2E_CTL="/nonexistent"))
    assert p.returncode == 0, p.stdout + p.stderr
    return {f[:-5]: json.loads((results / f).read_text())
            for f in os.listdir(results) if f.endswith(".json")}


def test_driver_results_contract(tmp_path):
    r = run_driver(tmp_path)
    assert set(r) == {"00-pass", "01-checkfail", "02-exit", "03-skip", "04-hang", "05-env",
                      "summary", "install"}
    assert r["00-pass"]["status"] == "passed"
    assert [c["what"] for c in r["00-pass"]["checks"]] == ["first thing", "second thing"]
    assert r["00-pass"]["stderr"] == "err"
    assert r["01-checkfail"]["status"] == "failed"
    assert r["01-checkfail"]["exit_code"] == 0 and r["01-checkfail"]["checks_failed"] == 1
    assert r["02-exit"]["status"] == "failed" and r["02-exit"]["exit_code"] == 3
    assert r["03-skip"]["status"] == "skipped" and r["03-skip"]["skip_reason"] == "no deb here"
    hang = r["04-hang"]
    assert hang["status"] == "timeout" and hang["timed_out"] and hang["timeout"] == 2
    assert hang["checks"] == [{"ok": True, "what": "before hang"}]
    assert hang["duration_s"] < 20
    assert [c["ok"] for c in r["05-env"]["checks"]] == [True, True, False]
    assert [s["name"] for s in r["summary"]["scenarios"]] == [
        "00-pass", "01-checkfail", "02-exit", "03-skip", "04-hang", "05-env"]


def test_scenario_go_programs():
    # The real kubelet's scenario asks for its programs; a selection without it asks for none, so
    # a run of other scenarios (or the benchmarks) never waits for a Go build.
    assert e2e_vm.scenario_go_programs(["58-real-kubelet"]) == [
        "kubelet", "containerd", "containerd-shim-runc-v2", "ctr"]
    assert e2e_vm.scenario_go_programs(["00-smoke", "20-policies"]) == []
    assert set(e2e_vm.scenario_go_programs(None)) >= {"kubelet", "containerd"}


def test_payload_layout(tmp_path):
    dest = tmp_path / "payload"
    fake = tmp_path / "kubelet"
    fake.write_text("#!/bin/sh\n")
    e2e_vm.build_payload(str(dest), scenarios=["00-smoke"], debs=[], programs={"kubelet": str(fake)})
    assert (dest / "bin" / "kubelet").read_text() == "#!/bin/sh\n"  # the real node's programs
    assert os.access(dest / "guest" / "run-scenarios", os.X_OK)
    assert (dest / "guest" / "memqos_e2e.py").exists()
    assert (dest / "scenarios" / "00-smoke.sh").exists()
    assert json.loads((dest / "run.json").read_text())["scenarios"] == ["00-smoke"]
    assert not (dest / "debs").exists()
    assert not (dest / "monitoring").exists()  # 65-alerts loads the rules the .deb installs, not a copy
    assert (dest / "bench" / "ws.py").exists()  # and runs the protection benchmark's workload
    assert "00-smoke" in e2e_vm.list_scenarios()


def test_image_key_is_stable():
    script = os.path.join(HERE, "build-image.sh")
    keys = {subprocess.run(["bash", script, "--key"], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)}
    assert len(keys) == 1 and len(keys.pop()) == 16


def test_busctl_argument_encoding():
    sys.path.insert(0, os.path.join(HERE, "guest"))
    import memqos_e2e as e

    assert e._split_sig("ssa(sv)a(sa(sv))") == ["s", "s", "a(sv)", "a(sa(sv))"]
    args = []
    body = ["x.scope", "fail", e._props({"Description": "a b", "PIDs": [5, 6],
                                          "Delegate": True, "MemoryMax": 10}), []]
    for t, v in zip(e._split_sig("ssa(sv)a(sa(sv))"), body):
        args += e._busctl_args(t, v)
    assert args == ["x.scope", "fail", "4", "Description", "s", "a b", "PIDs", "au", "2", "5",
                    "6", "Delegate", "b", "true", "MemoryMax", "t", "10", "0"]
    assert e.unit_path("kubepods-burstable-podab_c.slice") == \
        "/org/freedesktop/systemd1/unit/kubepods_2dburstable_2dpodab_5fc_2eslice"
    assert e.unit_path("-.slice") == "/org/freedesktop/systemd1/unit/_2d_2eslice"
    assert e.pod_slice_name("1-2", "Guaranteed") == "kubepods-pod1_2.slice"
    assert e.pod_slice_name("1-2", "BestEffort") == "kubepods-besteffort-pod1_2.slice"
    assert e._parent_slice("kubepods-burstable-pod1_2.slice") == "kubepods-burstable.slice"
    assert e._parent_slice("kubepods.slice") == "-.slice"
    pod = e.make_pod("p", [{"name": "c", "requests": {"memory": "1Gi", "cpu": "1"},
                            "limits": {"memory": "1Gi", "cpu": "1"}}])
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")


def test_missing_prerequisites_are_named(monkeypatch):
    monkeypatch.setattr(e2e_vm.shutil, "which", lambda tool, path=None: None)
    missing = e2e_vm.missing_prerequisites(need_build=True)
    assert "qemu-system-x86_64 not found" in missing and "debootstrap not found" in missing
    assert not any("debootstrap" in m for m in e2e_vm.missing_prerequisites(need_build=False))


def test_unavailable_skips_or_fails_under_ci(monkeypatch):
    import pytest

    import test_e2e

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        test_e2e._unavailable("no qemu")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        test_e2e._unavailable("no qemu")


def test_each_finished_scenario_is_one_line_the_host_passes_on(tmp_path):
    """`make test` streams a line per finished scenario: the host follows the serial log
    (vm._Follower) and passes on the driver's lines that FINISHED_RE matches."""
    payload = tmp_path / "payload"
    (payload / "scenarios").mkdir(parents=True)
    for name in ("00-pass.sh", "01-checkfail.sh", "03-skip.sh"):
        (payload / "scenarios" / name).write_text(SCENARIOS[name])
    os.symlink(os.path.join(HERE, "guest"), payload / "guest")
    (payload / "run.json").write_text(json.dumps({"cleanup": False}))
    p = subprocess.run([sys.executable, os.path.join(HERE, "guest", "run-scenarios"), "--payload", str(payload),
                        "--results", str(tmp_path / "results")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, MEMQOS_E2E_CTL="/nonexistent"))
    assert p.returncode == 0, p.stdout + p.stderr
    serial = tmp_path / "serial.log"
    seen = []
    follower = e2e_vm._Follower(str(serial), lambda line: seen.extend(
        m.group(1) for m in [e2e_vm.FINISHED_RE.search(line)] if m))
    follower.poll()  # no file yet: nothing, no error
    text = "".join(f"[ {i}.0] memqos-e2e-boot[279]: {line}\r\n" for i, line in enumerate((p.stdout + p.stderr).splitlines()))
    cut = len(text) // 2
    serial.write_text(text[:cut])  # half a line at the end: held back until the rest comes
    follower.poll()
    with open(serial, "a") as f:
        f.write(text[cut:])
    follower.poll()
    assert [s.split(":")[0] for s in seen] == ["=== 00-pass", "=== 01-checkfail", "=== 03-skip"], seen
    assert seen[0].startswith("=== 00-pass: passed (exit 0, ") and seen[1].startswith("=== 01-checkfail: failed")
    assert seen[2].startswith("=== 03-skip: skipped")


def test_scenarios_env_deselects_the_others_instead_of_failing_them():
    # MEMQOS_E2E_SCENARIOS narrows a run like -k (conftest.py): the scenarios it leaves out are
    # deselected, so the run neither boots them nor reports them as failed.
    env = dict(os.environ, MEMQOS_E2E_SCENARIOS="55,smoke")
    p = subprocess.run([sys.executable, "-m", "pytest", HERE, "--collect-only", "-q", "-p", "no:cacheprovider"],
                       capture_output=True, text=True, env=env, cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr
    chosen = sorted(line.split("[", 1)[1].rstrip("]") for line in p.stdout.splitlines() if "test_scenario[" in line)
    assert chosen and all("55" in name or "smoke" in name for name in chosen), chosen
    assert f"({len(e2e_vm.list_scenarios()) - len(chosen)} deselected)" in p.stdout, p.stdout
