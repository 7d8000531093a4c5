"""`memqos-systemd plan` as an operator runs it: a real subprocess, `python3 -m memqos_systemd`.

The contract is issue #2's: flags, the JSON document, exit 0 / 2 with one line naming the
field and the value. Pure: nothing here needs D-Bus or touches the machine.

The expected numbers for examples/ (16Gi node, 4 KiB pages) are worked out by hand below,
never taken from the code under test.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

import memqos_systemd
from prereq import require

Mi, Gi = 2**20, 2**30
# The tree this test file and the code under test come from (in pybuild's build directory the
# package sits next to tests/; in a checkout both sit at the top).
CODE_ROOT = Path(memqos_systemd.__file__).resolve().parent.parent


def _find_examples() -> Path | None:
    # examples/ is at the top of the source tree, which is an ancestor of this file also when
    # pybuild copies tests/ into .pybuild/<python>/build/.
    for d in Path(__file__).resolve().parents:
        if (d / "examples" / "pods.json").is_file():
            return d / "examples"
    return None


EXAMPLES = _find_examples()
# Under CI=true the tests run regardless, and fail loudly if examples/ is missing.
needs_examples = pytest.mark.skipif(EXAMPLES is None and os.environ.get("CI") != "true",
                                    reason="examples/ not found above tests/")
NODE = ["--node-memory", "16Gi", "--page-size", "4096"]


CLOSED = object()  # stdin=CLOSED: the command runs with descriptor 0 closed (`<&-`)


def cli(*args: str, stdin: bytes | None | object = None, timeout: float = 30, env: dict | None = None,
        stdout: int = subprocess.PIPE, cwd: Path = CODE_ROOT) -> subprocess.CompletedProcess:
    """Run the command line as an operator would; stdout/stderr as bytes, stdin a pipe, /dev/null
    or closed."""
    env = dict(os.environ, **{"COLUMNS": "100", **(env or {})},
               PYTHONPATH=os.pathsep.join(filter(None, [str(CODE_ROOT), os.environ.get("PYTHONPATH")])))
    closed = stdin is CLOSED
    if args and args[0] == "plan" and "--config" not in args and "--help" not in args:
        # Not this machine's installed config (plan reads it when it exists): the built-in
        # defaults, from a file that says so (an empty one would add a warning that it is empty).
        # The tests of that choice call main() in-process.
        args = (*args, "--config", _defaults_config())
    argv = [sys.executable, "-m", "memqos_systemd", *map(str, args)]
    if closed:  # the shell's `<&-`: exec with descriptor 0 closed
        argv = ["/bin/sh", "-c", 'exec "$@" <&-', "sh", *argv]
    return subprocess.run(argv, input=None if closed else stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None, stdout=stdout,
                          stderr=subprocess.PIPE, env=env, timeout=timeout, cwd=str(cwd))


@functools.cache
def _defaults_config() -> Path:
    """A config file that sets the built-in defaults' policy and nothing else, removed at exit."""
    d = Path(tempfile.mkdtemp(prefix="memqos-plan-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "defaults.yaml").write_text("memoryReservationPolicy: None\n")
    return d / "defaults.yaml"


def ok_json(*args: str, stdin: bytes | None = None) -> dict:
    p = cli("plan", *args, stdin=stdin)
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    return json.loads(p.stdout)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    """Bad input: exit 2, nothing on stdout, exactly one line on stderr, no traceback."""
    err = p.stderr.decode()
    assert p.returncode == 2, (p.returncode, err)
    assert "Traceback" not in err
    assert p.stdout == b""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memqos-systemd: error: "), lines[0]
    return lines[0]


# ====================================================================== the example node, by hand
# examples/config.yaml: TieredReservation, factor 0.9, hierarchy effective, kubeReserved 1Gi,
# systemReserved 512Mi, evictionHard memory.available 100Mi, all three enforced on /kube.slice
# and /system.slice.
CAPACITY = 16 * Gi                                   # 17179869184
ALLOCATABLE = 16 * Gi - 1 * Gi - 512 * Mi - 100 * Mi  # 15464398848
INF = "infinity"


def _high(req: int, limit: int) -> int:
    """floor((req + 0.9 (limit - req)) / 4096) * 4096, in exact integers."""
    return (req * 10 + 9 * (limit - req)) // 10 // 4096 * 4096


def _pod(uid: str, qos: str = "burstable") -> str:
    middle = "kubepods" if qos == "guaranteed" else f"kubepods-{qos}"
    return f"{middle}-pod{uid.replace('-', '_')}.slice"


def _scope(cid: str) -> str:
    return f"cri-containerd-{cid}.scope"


LEDGER, CHECKOUT, INDEXER = "payments/ledger-db-0", "payments/checkout-api-7d9c5b6f4-x2k8p", "search/indexer-5f8d9c7b6-qq4rt"
THUMB, ETCD, FEATURE = "batch/thumbnailer-29154710-7hxzq", "kube-system/etcd-worker-3", "ml/feature-store-6c7d8e9f0-lm3np"
# Burstable pod requests: checkout max(768Mi + 128Mi sidecar, 1Gi init 'migrate') = 1Gi; indexer 1Gi;
# etcd 100Mi; feature-store pod-level 768Mi + overhead 64Mi = 832Mi. Sum 2980Mi.
BURSTABLE_SUM = (1024 + 1024 + 100 + 832) * Mi
assert BURSTABLE_SUM == 3124756480

# unit -> (level, pod or None, MemoryMin, MemoryLow, MemoryHigh)
EXPECTED = {
    # effective hierarchy: MemoryMin = the Guaranteed pod's 2Gi, MemoryLow = the Burstable sum.
    "kubepods.slice": ("node", None, 2 * Gi, BURSTABLE_SUM, INF),
    "kube.slice": ("reserved", None, 1 * Gi, 0, INF),
    "system.slice": ("reserved", None, 512 * Mi, 0, INF),
    "kubepods-burstable.slice": ("qos", None, 0, BURSTABLE_SUM, INF),
    "kubepods-besteffort.slice": ("qos", None, 0, 0, INF),
    _pod("6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c", "guaranteed"): ("pod", LEDGER, 2 * Gi, 0, INF),
    _scope("71b91629faef90a4934e94a4b7ffdb6686df30c86c502252924c9937616e4762"): ("container", LEDGER, 2 * Gi, 0, INF),
    _pod("8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e"): ("pod", CHECKOUT, 0, 1 * Gi, INF),
    # sidecar envoy: 128Mi, limit 256Mi -> 128Mi + 0.9 * 128Mi = 243.2Mi -> 255012864
    _scope("84532b306f259587c364bd7301e0813963d5b84fd27c9338f0862dab8f0499d7"):
        ("container", CHECKOUT, 0, 128 * Mi, _high(128 * Mi, 256 * Mi)),
    # api: 768Mi, limit 1536Mi -> 1459.2Mi -> 1530081280
    _scope("d737056eff789f916ba6eed388879a67ea8ae501eb9ccdd185ddcc9cd7daafb3"):
        ("container", CHECKOUT, 0, 768 * Mi, _high(768 * Mi, 1536 * Mi)),
    _pod("3f2e1d0c-9b8a-4765-b4c3-d2e1f0a9b8c7"): ("pod", INDEXER, 0, 1 * Gi, INF),
    # no limit: towards allocatable
    _scope("70fa78e5ae55563976b332a6da662e9877dc6ed6965f676453d8f4a35ebdf483"):
        ("container", INDEXER, 0, 1 * Gi, _high(1 * Gi, ALLOCATABLE)),
    _pod("c4d5e6f7-a8b9-4c0d-9e1f-2a3b4c5d6e7f", "besteffort"): ("pod", THUMB, 0, 0, INF),
    _scope("05eeec2d70845694d3ba89ad9e1c34b6b4d806275c3c63b84241a40ae4591ca4"):
        ("container", THUMB, 0, 0, _high(0, ALLOCATABLE)),
    # a static pod: 32-hex UID, written as is
    "kubepods-burstable-pod9d0b6e0f3a1c4b7e8f2d5a6c7b8e9f01.slice": ("pod", ETCD, 0, 100 * Mi, INF),
    _scope("c38cbd92fce41312f3fbdce60510013b7f0d4004a03b45c8e762f98f1ed4006c"):
        ("container", ETCD, 0, 100 * Mi, _high(100 * Mi, ALLOCATABLE)),
    # pod-level limit 1Gi (+ 64Mi overhead = 1088Mi) gives the pod slice a MemoryHigh
    _pod("5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"): ("pod", FEATURE, 0, 832 * Mi, _high(832 * Mi, 1088 * Mi)),
    _scope("e93a4cf7dd38830f4276bfc50504fc5917e169df74c2c746e2072f93126dee04"):
        ("container", FEATURE, 0, 256 * Mi, _high(256 * Mi, 512 * Mi)),
    _scope("df182948e11b82eb818cbc79ba91b7c2e41f03473e09cfe1ecbcc8ee23225ae9"):
        ("container", FEATURE, 0, 256 * Mi, _high(256 * Mi, 512 * Mi)),
}
assert _high(768 * Mi, 1536 * Mi) == 1530081280 and _high(0, ALLOCATABLE) == 13917958144


def _check_contract(doc: dict) -> None:
    """The shape issue #2 fixes, whatever the values (and what later issues added)."""
    # Added by issue 42: the pods' protection, each byte once, and the kubelet's part of it; what
    # the kubelet writes as its own and why (and `companion` when it writes any of these values).
    assert set(doc) - {"companion"} == {"node", "units", "warnings", "protected", "kubelet"}
    assert set(doc["protected"]) == {"MemoryMin", "MemoryLow", "kubeletMemoryMin", "kubeletMemoryLow"}
    assert sum(u["MemoryMin"] for u in doc["units"] if u["level"] == "pod") == doc["protected"]["MemoryMin"]
    assert sum(u["MemoryLow"] for u in doc["units"] if u["level"] == "pod") == doc["protected"]["MemoryLow"]
    assert set(doc["kubelet"]) == {"mode", "why", "writes", "memoryReservationPolicy", "memoryThrottlingFactor"}
    assert set(doc["node"]) == {"capacityBytes", "allocatableBytes"}
    for v in doc["node"].values():
        assert type(v) is int
    assert isinstance(doc["warnings"], list) and all(isinstance(w, str) for w in doc["warnings"])
    assert isinstance(doc["units"], list)
    for u in doc["units"]:
        assert u["level"] in ("node", "qos", "pod", "container", "reserved"), u
        want = {"unit", "level", "MemoryMin", "MemoryLow", "MemoryHigh"}
        if u["level"] in ("pod", "container"):
            want.add("pod")
            ns, _, name = u["pod"].partition("/")
            assert ns and name and "/" not in name, u
        if u["level"] == "container":  # added by issue 20: the container's name
            want.add("container")
            assert isinstance(u["container"], str) and u["container"], u
        if u["level"] == "pod" and "resizePending" in u:  # added by issue 16: a pod's pending resize
            want.add("resizePending")
            assert isinstance(u["resizePending"], str) and u["resizePending"], u
        if doc.get("companion"):  # issue 36: which of its values the kubelet writes (shown, never sent)
            want.add("kubelet")
        assert set(u) == want, u
        assert type(u["unit"]) is str
        for key in ("MemoryMin", "MemoryLow"):
            assert type(u[key]) is int and 0 <= u[key] < 2**64 - 1, u
        high = u["MemoryHigh"]
        assert high == "infinity" or (type(high) is int and 0 < high < 2**64 - 1), u
    names = [u["unit"] for u in doc["units"]]
    assert len(names) == len(set(names)), "a unit is listed twice"


# The container of each scope, by name (examples/pods.json's spec.containers[].name).
CONTAINERS = {
    "71b91629faef": "postgres", "84532b306f25": "envoy", "d737056eff78": "api", "70fa78e5ae55": "indexer",
    "05eeec2d7084": "thumbnailer", "c38cbd92fce4": "etcd", "e93a4cf7dd38": "server", "df182948e11b": "cache",
}


def _as_table(doc: dict) -> dict:
    return {u["unit"]: (u["level"], u.get("pod"), u["MemoryMin"], u["MemoryLow"], u["MemoryHigh"]) for u in doc["units"]}


@pytest.fixture
def example_args():
    if EXAMPLES is None:
        require(False, "examples/ not found above tests/")
    return ["--pods", str(EXAMPLES / "pods.json"), "--config", str(EXAMPLES / "config.yaml"), *NODE]


@pytest.fixture
def example_doc() -> dict:
    if EXAMPLES is None:
        require(False, "examples/ not found above tests/")
    return json.loads((EXAMPLES / "pods.json").read_text())


# ====================================================================== JSON contract
def test_json_contract_on_the_example_node(example_args):
    doc = ok_json(*example_args, "--output", "json")
    _check_contract(doc)
    assert doc["node"] == {"capacityBytes": CAPACITY, "allocatableBytes": ALLOCATABLE}
    assert doc["warnings"] == []
    assert _as_table(doc) == EXPECTED
    assert {u["unit"][len("cri-containerd-"):][:12]: u["container"] for u in doc["units"]
            if u["level"] == "container"} == CONTAINERS
    # The Succeeded pod (batch/report-...) and the finished init container 'migrate' get nothing.
    listed = json.dumps(doc)
    assert "0e1f2a3b" not in listed and "report-29154650" not in listed
    assert "3bc801a33ea83df4" not in listed


def test_json_is_the_default_when_stdout_is_not_a_terminal(example_args):
    assert ok_json(*example_args) == ok_json(*example_args, "--output", "json")


def test_stdin_dash_reads_the_same_pods(example_args, example_doc):
    args = list(example_args)
    args[1] = "-"
    assert ok_json(*args, stdin=json.dumps(example_doc).encode()) == ok_json(*example_args)


def test_yaml_pods_file_and_yaml_on_stdin(example_args, example_doc, tmp_path):
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump(example_doc))
    args = list(example_args)
    args[1] = str(path)
    expected = ok_json(*example_args)
    assert ok_json(*args) == expected
    args[1] = "-"
    assert ok_json(*args, stdin=yaml.safe_dump(example_doc).encode()) == expected


def test_a_list_of_pods_is_a_pod_list(example_args, example_doc, tmp_path):
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(example_doc["items"]))
    args = list(example_args)
    args[1] = str(path)
    assert ok_json(*args) == ok_json(*example_args)


def test_a_single_pod(example_args, example_doc, tmp_path):
    ledger = dict(example_doc["items"][0], kind="Pod", apiVersion="v1")
    assert ledger["metadata"]["name"] == "ledger-db-0"
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(ledger))
    args = list(example_args)
    args[1] = str(path)
    doc = ok_json(*args)
    _check_contract(doc)
    keep = {"kubepods.slice", "kube.slice", "system.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice",
            _pod("6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c", "guaranteed"),
            _scope("71b91629faef90a4934e94a4b7ffdb6686df30c86c502252924c9937616e4762")}
    want = {u: v for u, v in EXPECTED.items() if u in keep}
    # Only the Guaranteed pod: nothing Burstable to protect with MemoryLow.
    want["kubepods.slice"] = ("node", None, 2 * Gi, 0, INF)
    want["kubepods-burstable.slice"] = ("qos", None, 0, 0, INF)
    assert _as_table(doc) == want


def test_node_memory_quantity_forms(example_args):
    args = list(example_args)
    i = args.index("--node-memory")
    args[i + 1] = str(CAPACITY)  # plain bytes
    assert ok_json(*args)["node"] == {"capacityBytes": CAPACITY, "allocatableBytes": ALLOCATABLE}
    args[i + 1] = "16384Mi"
    assert ok_json(*args)["node"]["capacityBytes"] == CAPACITY


def test_no_config_means_builtin_defaults(monkeypatch, capsys, tmp_path):
    # No --config and no installed config (whatever this machine has at the real path).
    doc = json.loads(_plan_in_process(monkeypatch, capsys, tmp_path / "absent.yaml", "--output", "json"))
    _check_contract(doc)
    # defaults: policy None (no protection), evictionHard 100Mi, no reserved slices
    assert doc["node"] == {"capacityBytes": CAPACITY, "allocatableBytes": CAPACITY - 100 * Mi}
    assert {u["level"] for u in doc["units"]} == {"node", "qos", "pod", "container"}
    assert all(u["MemoryMin"] == 0 and u["MemoryLow"] == 0 for u in doc["units"])


def test_rejected_pods_are_warnings_and_exit_0(tmp_path):
    bad = {"kind": "PodList", "items": [
        {"metadata": {"name": "odd", "namespace": "ns", "uid": "not-a-uuid"},
         "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]},
         "status": {"phase": "Running", "qosClass": "Burstable"}}]}
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(bad))
    doc = ok_json("--pods", str(path), *NODE)
    _check_contract(doc)
    assert len(doc["warnings"]) == 1 and "ns/odd" in doc["warnings"][0] and "not-a-uuid" in doc["warnings"][0]
    assert not any("not_a_uuid" in u["unit"] or u["level"] == "pod" for u in doc["units"])


# ====================================================================== in-place resize (issue 16)
RESIZE_PODS = Path(__file__).parent / "data" / "kubelet-pods-resize-v1.35.json"
PENDING = {"resize/deferred": "Deferred", "resize/infeasible": "Infeasible",
           "resize/pending-in-progress": "Infeasible", "resize/sidecar-deferred": "Deferred",
           "resize/pod-level": "Infeasible"}


def test_a_pending_resize_is_marked_in_the_json_and_planned_from_what_was_allocated():
    doc = ok_json("--pods", str(RESIZE_PODS), *NODE)
    _check_contract(doc)
    assert {u["pod"]: u["resizePending"] for u in doc["units"] if "resizePending" in u} == PENDING
    assert sorted(w.split(":")[0] for w in doc["warnings"] if "resize pending" in w) == sorted(
        f"pod {key}" for key in PENDING)
    # resize/infeasible asks for 64Gi/96Gi; the kubelet allocated 512Mi/1Gi, and so do we.
    scope = next(u for u in doc["units"] if u["level"] == "container" and u["pod"] == "resize/infeasible")
    assert scope["MemoryHigh"] == _high(512 * Mi, Gi)


def test_a_pending_resize_is_marked_on_the_pods_row_of_the_table():
    p = cli("plan", "--pods", str(RESIZE_PODS), *NODE, "--output", "table")
    assert p.returncode == 0, p.stderr
    rows = p.stdout.decode().splitlines()
    for key, reason in PENDING.items():
        # the name may be cut in the middle to keep the row in 100 columns (issue 33); the mark never is
        marked = [r for r in rows if f" (resize pending: {reason})" in r and f" {key[:10]}" in r and f"{key[-8:]} (" in r]
        assert len(marked) == 1 and " pod " in marked[0], key  # the pod slice's row, not its containers'
        assert sum(f" {key[:10]}" in r for r in rows) >= 1  # its containers, unmarked
    assert not any("resize pending" in r for r in rows if "resize/running" in r or "resize/in-progress" in r)
    assert sum("resize pending (" in r for r in rows[rows.index("warnings:"):]) == len(PENDING)


# ====================================================================== table
def _table_mentions_every_unit(text: str, doc: dict) -> None:
    """The table names every row by what a person looks for: the slices of the node by unit name,
    a pod by its name, a container by its name; never a cut unit name."""
    for u in doc["units"]:
        if u["level"] == "container":
            assert f" {u['container']} " in text, u
        elif u["level"] == "pod":
            assert u["pod"] in text, u
        else:
            assert u["unit"] in text, u
    assert "…" not in text and "..." not in text


def _demo(*extra: str) -> str:
    """What `make demo` prints: its arguments (the Makefile's EXAMPLE_ARGS), relative to the top of
    the tree, from there. Never absolute paths: the table's header names the config as given, and
    the tree may live anywhere (a package build's directory is long)."""
    p = cli("plan", "--pods", "examples/pods.json", "--config", "examples/config.yaml",
            "--node-memory", "16Gi", *extra, cwd=EXAMPLES.parent)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    return p.stdout.decode()


def test_table_lists_every_unit(example_args):
    p = cli("plan", *example_args, "--output", "table")
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    _table_mentions_every_unit(text, ok_json(*example_args))
    assert text.startswith("node: capacity 16Gi (--node-memory), allocatable 14.4Gi\n")
    assert "policy TieredReservation" in text
    for column in ("SLICE / POD / CONTAINER", "LEVEL", "MemoryMin", "MemoryLow", "MemoryHigh"):
        assert column in text
    assert "{" not in text  # not JSON


def test_the_demo_table_teaches(example_args):
    """issue 20: what `make demo` prints fits 100 columns and says where its inputs came from,
    what the columns mean, what it all adds up to, what was left out, and what to run next."""
    text = _demo("--output", "table")
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert "config: examples/config.yaml" in lines
    assert lines[0] == "node: capacity 16Gi (--node-memory), allocatable 14.4Gi"
    assert any(line.startswith("legend: MemoryMin ") for line in lines)
    # The pod slices: MemoryMin 2Gi (ledger-db-0) + MemoryLow 2.91Gi (the Burstable pods), by hand above;
    # each byte once (kubepods.slice backs the same bytes, issue 42)
    assert "total: 6 pod(s) protected by 4.91Gi of 14.4Gi allocatable: MemoryMin 2Gi + MemoryLow 2.91Gi" in lines
    assert "  the kubelet: not read (no kubeletConfigFile): every value shown is memqos-systemd's" in lines
    assert "       and 1.5Gi of MemoryMin for the reserved slices" in lines
    # batch/report-29154650-abcde has Succeeded
    assert "skipped: 1 finished pod(s) (Succeeded or Failed), which hold no memory" in lines
    assert lines[-1] == "next, on a node: memqos-systemd check; then memqos-systemd apply --once --dry-run"
    row = next(line for line in lines if line.strip().startswith("envoy "))
    assert row.split() == ["envoy", "container", "0", "128Mi", "243.2Mi"]


def test_wide_table_gives_every_full_unit_name(example_args):
    text = _demo("--output", "wide")
    for u in ok_json(*example_args)["units"]:
        row = next(line for line in text.splitlines() if line.endswith("  " + u["unit"]))
        assert _show(u["MemoryMin"]) in row.split() and _show(u["MemoryHigh"]) in row.split(), (u, row)
    assert "UNIT" in next(line for line in text.splitlines() if line.startswith("SLICE / POD / CONTAINER"))


def _show(n) -> str:
    return n if n == "infinity" else "0" if n == 0 else (
        next(f"{n / s:.2f}".rstrip("0").rstrip(".") + u for u, s in (("Gi", Gi), ("Mi", Mi), ("Ki", 1024), ("", 1))
             if n >= s))


def test_the_capacity_source_is_named(tmp_path):
    p = cli("plan", "--pods", str(EXAMPLES / "pods.json"), "--config", str(EXAMPLES / "config.yaml"), "--output", "table")
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().startswith("node: capacity ") and "(MemTotal of /proc/meminfo)" in p.stdout.decode()


def test_table_is_the_default_on_a_terminal(example_args):
    env = dict(os.environ, PYTHONPATH=str(CODE_ROOT))
    try:
        master, slave = pty.openpty()
    except OSError as e:  # a build chroot without /dev/ptmx
        require(False, f"no pseudo-terminal: {e}")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "memqos_systemd", "plan", *example_args], stdout=slave,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=str(CODE_ROOT))
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        proc.stderr.close()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert text.startswith("node: capacity 16Gi")
    _table_mentions_every_unit(text, ok_json(*example_args))


# ====================================================================== --help
SUBCOMMANDS = {
    "plan": ["--pods", "--config", "--node-memory", "--page-size", "--output", "stdin", "never systemd",
             "https://$(hostname):10250/pods", "the installed config"],
    "apply": ["--config", "--once", "--dry-run", "SetUnitProperties"],
    "run": ["--config", "SIGTERM", "SIGHUP"],
    "status": ["--config", "--output", "DRIFT"],
    "reset": ["--config", "--dry-run", "infinity"],
    "check": ["--config", "cgroup v2"],
}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_of_each_subcommand(command):
    p = cli(command, "--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert out.startswith(f"usage: memqos-systemd {command}")
    for word in SUBCOMMANDS[command]:
        assert word in out, (command, word)
    assert "10255" not in out  # the read-only port, off on kubeadm nodes: not the example to copy
    assert p.stderr == b""


def test_top_level_help_lists_every_command_and_exit_codes():
    p = cli("--help")
    assert p.returncode == 0
    out = p.stdout.decode()
    for command in SUBCOMMANDS:
        assert f"\n    {command}" in out, command
    assert "Exit status: 0 success, 1 runtime failure" in out and "2 bad input" in out


def test_version():
    p = cli("--version")
    assert p.returncode == 0
    assert p.stdout.decode().startswith(f"memqos-systemd {memqos_systemd.__version__}")


# ====================================================================== bad input: exit 2, one line
def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _bad_cases(tmp_path: Path) -> dict:
    pods = str(EXAMPLES / "pods.json")
    cfg = str(EXAMPLES / "config.yaml")
    missing = str(tmp_path / "no-such-pods.json")
    return {
        # case: (argv, [strings the one error line must contain])
        "missing pods file": (["--pods", missing, *NODE], ["--pods", missing, "No such file"]),
        "missing config file": (["--pods", pods, "--config", str(tmp_path / "nope.yaml"), *NODE],
                                ["nope.yaml", "cannot read config"]),
        "invalid YAML pods": (["--pods", _write(tmp_path, "bad.yaml", "items: [\n  {kind: Pod\n"), *NODE],
                              ["--pods", "bad.yaml", "not valid YAML (or JSON)", "line"]),
        "invalid YAML config": (["--pods", pods, "--config", _write(tmp_path, "c.yaml", "a: [b\n"), *NODE],
                                ["c.yaml", "not valid YAML", "line"]),
        "node memory 12Q": (["--pods", pods, "--node-memory", "12Q", "--page-size", "4096"],
                            ["--node-memory", "'12Q' is not a memory quantity"]),
        # A quantity, but too large: the message says so, not "is not a memory quantity" (issue 26).
        "node memory 99999999Ei": (["--pods", pods, "--node-memory", "99999999Ei", "--page-size", "4096"],
                                   ["--node-memory: '99999999Ei' is larger than the largest memory quantity"]),
        "node memory 0": (["--pods", pods, "--node-memory", "0", "--page-size", "4096"], ["--node-memory", "'0'"]),
        "node memory -16Gi": (["--pods", pods, "--node-memory", "-16Gi", "--page-size", "4096"],
                              ["--node-memory", "'-16Gi'", "positive"]),
        "page size -4096": (["--pods", pods, "--node-memory", "16Gi", "--page-size", "-4096"],
                            ["--page-size", "-4096", "power of two"]),
        "stdin closed": (["--pods", "-", *NODE], ["--pods -", "standard input is closed"]),
        "eviction threshold 150%": (["--pods", pods, *NODE, "--config",
                                     _write(tmp_path, "e.yaml", "evictionHard: {memory.available: '150%'}\n")],
                                    ["evictionHard.memory.available", "'150%'", "[0%, 100%)"]),
        "page size 3000": (["--pods", pods, "--node-memory", "16Gi", "--page-size", "3000"],
                           ["--page-size", "3000", "power of two"]),
        "page size abc": (["--pods", pods, "--node-memory", "16Gi", "--page-size", "abc"], ["--page-size", "'abc'"]),
        "throttling factor 1.5": (["--pods", pods, *NODE, "--config",
                                   _write(tmp_path, "f.yaml", "memoryThrottlingFactor: 1.5\n")],
                                  ["memoryThrottlingFactor", "1.5", "(0, 1]"]),
        "unknown config key": (["--pods", pods, *NODE, "--config",
                                _write(tmp_path, "k.yaml", "memoryThrotlingFactor: 0.5\n")],
                               ["memoryThrotlingFactor", "not a known key"]),
        "config key in the wrong case": (["--pods", pods, *NODE, "--config",
                                          _write(tmp_path, "case.yaml", "MemoryReservationPolicy: None\n")],
                                         ["MemoryReservationPolicy", "did you mean memoryReservationPolicy"]),
        "wrong policy": (["--pods", pods, *NODE, "--config",
                          _write(tmp_path, "p.yaml", "memoryReservationPolicy: Hard\n")],
                         ["memoryReservationPolicy", "'Hard'"]),
        "a Deployment": (["--pods", _write(tmp_path, "deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\n"
                                                                    "metadata: {name: web}\nspec: {replicas: 3}\n"), *NODE],
                         ["kind", "Deployment"]),
        "reservations bigger than the node": (["--pods", pods, *NODE, "--config", _write(
            tmp_path, "big.yaml", "kubeReserved: {memory: 10Gi}\nsystemReserved: {memory: 6Gi}\n")],
            ["big.yaml: allocatable", "negative", "kubeReserved 10Gi", "systemReserved 6Gi", "= -100Mi"]),
        "empty stdin": (["--pods", "-", *NODE], ["--pods -: nothing on standard input", "did that command fail?"]),
        "JSON nested too deeply": (["--pods", _write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000), *NODE],
                                   ["--pods", "deep.json", "nested too deeply"]),
        "reserved cgroup that is kubepods.slice": (["--pods", pods, *NODE, "--config", _write(
            tmp_path, "r.yaml", "memoryReservationPolicy: HardReservation\nkubeReserved: {memory: 1Gi}\n"
                                "kubeReservedCgroup: /kubepods.slice\nenforceNodeAllocatable: [pods, kube-reserved]\n")],
            ["kubeReservedCgroup", "'/kubepods.slice'"]),
        "cgroupRoot with ..": (["--pods", pods, *NODE, "--config", _write(tmp_path, "root.yaml", "cgroupRoot: /a/..\n")],
                               ["cgroupRoot", "'..'"]),
        "pods not a list": (["--pods", _write(tmp_path, "items.json", '{"kind": "PodList", "items": "x"}'), *NODE],
                            ["items"]),
        "example config with the example pods, too small a node": (
            ["--pods", pods, "--config", cfg, "--node-memory", "1Gi", "--page-size", "4096"],
            ["config.yaml: allocatable", "negative", "capacity 1Gi", "= -612Mi"]),
    }


BAD_CASES = ["missing pods file", "missing config file", "invalid YAML pods", "invalid YAML config", "node memory 12Q",
             "node memory 99999999Ei", "node memory 0", "node memory -16Gi", "page size -4096", "stdin closed", "eviction threshold 150%",
             "page size 3000", "page size abc", "throttling factor 1.5", "unknown config key",
             "config key in the wrong case", "wrong policy", "a Deployment", "reservations bigger than the node",
             "empty stdin", "JSON nested too deeply", "reserved cgroup that is kubepods.slice", "cgroupRoot with ..",
             "pods not a list", "example config with the example pods, too small a node"]


@needs_examples
@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_exits_2_with_one_line_naming_field_and_value(case, tmp_path):
    argv, needles = _bad_cases(tmp_path)[case]
    if case == "stdin closed":
        line = one_error_line(cli("plan", *argv, stdin=CLOSED))
    else:
        line = one_error_line(cli("plan", *argv, stdin=b"" if "-" in argv else None))
    for needle in needles:
        assert needle in line, (case, needle, line)


def test_bad_case_list_is_complete(tmp_path):
    if EXAMPLES is None:
        require(False, "examples/ not found above tests/")
    assert sorted(_bad_cases(tmp_path)) == sorted(BAD_CASES)


@pytest.mark.parametrize("argv", [
    ["plan"],                                           # --pods is required
    ["plan", "--pods", "x.json", "--output", "xml"],    # not a choice
    ["frobnicate"],
    [],
])
def test_usage_errors_exit_2_without_traceback(argv):
    p = cli(*argv)
    assert p.returncode == 2
    err = p.stderr.decode()
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("memqos-systemd")
    assert "error:" in err


# ====================================================================== issue 20: no traceback, ever
ASCII = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}  # a non-UTF-8 locale


def _odd_pod(name: str, request: str = "1Gi", limit: str | None = None) -> dict:
    resources: dict = {"requests": {"memory": request}}
    if limit:
        resources["limits"] = {"memory": limit}
    return {"metadata": {"name": name, "namespace": "ns", "uid": "0b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b0c"},
            "spec": {"containers": [{"name": "c", "resources": resources}]},
            "status": {"phase": "Running", "qosClass": "Burstable", "containerStatuses": [
                {"name": "c", "containerID": "containerd://" + "ab" * 32}]}}


@pytest.mark.parametrize("env", [ASCII, {"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"}],
                         ids=["LC_ALL=C", "PYTHONIOENCODING=ascii", "PYTHONIOENCODING=latin-1"])
def test_table_and_warnings_under_a_non_utf8_locale(env, tmp_path):
    # A pod name no Latin-1 can hold, and one too long for a log line (cut with an ellipsis).
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": [
        dict(_odd_pod("ünïcødé-€-" + "x" * 200), spec={"containers": [{"name": "c", "resources": "bad"}]})]}))
    for output in ("table", "json", "wide"):
        p = cli("plan", "--pods", str(path), *NODE, "--output", output, env=env)
        err = p.stderr.decode()
        assert p.returncode == 0 and "Traceback" not in err, err
        out = p.stdout.decode("ascii" if env.get("PYTHONIOENCODING") != "latin-1" else "latin-1")
        assert "pod skipped" in out and "\\u20ac" in out, out  # the warning, escaped, not an exception
    p = cli("plan", *["--pods", str(EXAMPLES / "pods.json"), *NODE, "--output", "table"], env=env)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("output", ["table", "json"])
def test_output_that_cannot_be_written_is_one_line_and_exit_1(output):
    with open("/dev/full", "wb") as full:
        p = cli("plan", "--pods", str(EXAMPLES / "pods.json"), *NODE, "--output", output, stdout=full.fileno())
    assert p.returncode == 1, p.stderr
    assert p.stderr.decode().splitlines() == ["memqos-systemd: error: cannot write the output: No space left on device"]


def test_stdout_closed_is_one_line_and_exit_1():
    p = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "memqos_systemd", "plan",
                        "--pods", str(EXAMPLES / "pods.json"), *NODE], stderr=subprocess.PIPE, cwd=str(CODE_ROOT),
                       env=dict(os.environ, PYTHONPATH=str(CODE_ROOT)), timeout=30)
    assert p.returncode == 1
    assert p.stderr.decode().splitlines() == ["memqos-systemd: error: cannot write the output: standard output is closed"]


HELP_AND_VERSION = [["--help"], ["--version"], ["plan", "--help"], ["check", "--help"], ["status", "-h"]]


@pytest.mark.parametrize("argv", HELP_AND_VERSION, ids=" ".join)
def test_help_and_version_into_a_full_or_closed_stdout_is_one_line_and_exit_1(argv):
    """argparse prints these itself, before any command runs (issue 26: an OutputError traceback)."""
    with open("/dev/full", "wb") as full:
        p = cli(*argv, stdout=full.fileno())
    assert p.returncode == 1, p.stderr
    assert p.stderr.decode().splitlines() == ["memqos-systemd: error: cannot write the output: No space left on device"]
    p = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "memqos_systemd", *argv],
                       stderr=subprocess.PIPE, cwd=str(CODE_ROOT), env=dict(os.environ, PYTHONPATH=str(CODE_ROOT)),
                       timeout=30)
    assert p.returncode == 1
    assert p.stderr.decode().splitlines() == ["memqos-systemd: error: cannot write the output: standard output is closed"]


@pytest.mark.parametrize("argv", HELP_AND_VERSION, ids=" ".join)
def test_help_and_version_still_print_and_exit_0(argv):
    p = cli(*argv)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    assert p.stdout.decode().startswith("usage: memqos-systemd" if argv[-1] != "--version" else "memqos-systemd ")


def test_a_reader_that_stops_early_is_no_error():
    p = subprocess.run(f'{sys.executable} -m memqos_systemd plan --pods {EXAMPLES / "pods.json"} --node-memory 16Gi'
                       f' --output json | head -c 10 >/dev/null', shell=True, stderr=subprocess.PIPE,
                       cwd=str(CODE_ROOT), env=dict(os.environ, PYTHONPATH=str(CODE_ROOT)), timeout=30)
    assert p.returncode == 0 and p.stderr == b"", p.stderr


def test_a_non_ascii_pods_file_under_a_non_utf8_locale_is_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("podsFile: /srv/pöds€.json\n", encoding="utf-8")
    # check raised UnicodeEncodeError in sources/file.py; plan reads the config the same way (config.py).
    for argv in (["check"], ["plan", "--pods", str(EXAMPLES / "pods.json"), *NODE]):
        line = one_error_line(cli(*argv, "--config", str(config), env=ASCII))
        assert "podsFile" in line and "file name encoding (ascii)" in line and "UTF-8 locale" in line, line


# ====================================================================== issue 20: which config plan used
def _plan_in_process(monkeypatch, capsys, config_path: Path, *argv: str) -> str:
    from memqos_systemd import cli as cli_module

    monkeypatch.setattr(cli_module, "DEFAULT_CONFIG_PATH", str(config_path))
    assert cli_module.main(["plan", "--pods", str(EXAMPLES / "pods.json"), *NODE, *argv]) == 0
    return capsys.readouterr().out


def test_plan_reads_the_installed_config_and_says_so(monkeypatch, capsys, tmp_path):
    installed = tmp_path / "config.yaml"
    installed.write_text((EXAMPLES / "config.yaml").read_text())
    text = _plan_in_process(monkeypatch, capsys, installed, "--output", "table")
    assert f"config: {installed} (the installed config; --config for another)" in text.splitlines()
    assert "policy TieredReservation" in text
    assert json.loads(_plan_in_process(monkeypatch, capsys, installed, "--output", "json")) == ok_json(
        "--pods", str(EXAMPLES / "pods.json"), *NODE, "--config", str(EXAMPLES / "config.yaml"))


def test_plan_with_an_empty_config_says_what_it_means(tmp_path):
    empty = _write(tmp_path, "empty.yaml", "")
    doc = ok_json("--pods", str(EXAMPLES / "pods.json"), *NODE, "--config", empty)
    assert doc["warnings"][0].startswith(f"{empty} sets no key") and "nothing is protected" in doc["warnings"][0]
    table = cli("plan", "--pods", str(EXAMPLES / "pods.json"), *NODE, "--config", empty, "--output", "table")
    text = table.stdout.decode()
    warned = text[text.index("warnings:\n  - "):]
    assert " ".join(warned.split()).startswith(f"warnings: - {doc['warnings'][0]}")  # wrapped to 100 columns
    assert max(len(line) for line in warned.splitlines() if " " in line.strip()) <= 100


def test_plan_without_any_config_says_so_loudly(monkeypatch, capsys, tmp_path):
    text = _plan_in_process(monkeypatch, capsys, tmp_path / "absent.yaml", "--output", "table")
    assert "config: NONE: built-in defaults, which protect nothing" in text
    assert "policy None" in text


# ====================================================================== issue 20: warnings that name the pod
def test_a_request_above_its_limit_and_requests_above_the_node_warn_naming_the_pod(tmp_path):
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": [_odd_pod("greedy", "40Gi", "2Gi")]}))
    doc = ok_json("--pods", str(path), *NODE)
    assert "pod ns/greedy container 'c': request 40Gi is above its limit 2Gi; planned from the request," \
           " not throttled" in doc["warnings"]
    assert "pods request 40Gi in total, more than the node's allocatable 15.9Gi (capacity 16Gi); the largest:" \
           " pod ns/greedy with 40Gi" in doc["warnings"]


def test_one_quoting_style_for_pod_names_in_warnings(tmp_path):
    """`pod ns/name: ...` whether the pod was planned or refused (before issue 20: 'ns/name' quoted)."""
    refused = dict(_odd_pod("refused"), spec={"containers": [{"name": "c", "resources": "bad"}]})
    over = _odd_pod("over", "2Gi", "1Gi")
    over["metadata"] = dict(over["metadata"], uid="1b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b0c")
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": [refused, over]}))
    warnings = ok_json("--pods", str(path), *NODE)["warnings"]
    assert [w.split(":")[0].split(" container")[0] for w in warnings] == ["pod ns/refused", "pod ns/over"], warnings


# issue 33, item 8: usage errors.
@pytest.mark.parametrize("command", ["plan", "apply", "run", "status", "reset", "check"])
def test_an_unknown_option_is_said_with_the_commands_own_usage(command):
    extra = ("--pods", "-") if command == "plan" else ()
    p = cli(command, *extra, "--frob", "--config", "/nonexistent")
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err.startswith(f"usage: memqos-systemd {command} [-h]"), err
    assert err.splitlines()[-1] == f"memqos-systemd {command}: error: unrecognized arguments: --frob", err


@pytest.mark.parametrize("argv", [
    ("plan", "--pods", "-", "--frob"),  # argparse's own usage error
    ("plan",),  # a required option missing
    ("plan", "--pods", "-", "--node-memory", "lots"),  # ours
    ("frob",),
])
@pytest.mark.parametrize("stderr", ["/dev/full", "closed"])
def test_a_usage_error_exits_2_when_standard_error_cannot_be_written(argv, stderr):
    with open(os.devnull, "rb") as stdin:
        cmd = [sys.executable, "-m", "memqos_systemd", *argv]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(CODE_ROOT), os.environ.get("PYTHONPATH")])))
        if stderr == "closed":
            p = subprocess.run(["/bin/sh", "-c", 'exec "$@" 2>&-', "sh", *cmd], stdin=stdin,
                               stdout=subprocess.PIPE, env=env, timeout=30, cwd=str(CODE_ROOT))
        else:
            with open("/dev/full", "w") as full:
                p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=full, env=env, timeout=30,
                                   cwd=str(CODE_ROOT))
    assert p.returncode == 2
    assert p.stdout == b""


def test_status_help_has_no_broken_line():
    """Each paragraph of the description runs to the width of its neighbours: no line cut short
    in the middle of one (`name): QoS class, request,`)."""
    out = cli("status", "--help").stdout.decode()
    description = out.split("\n\n")[1].splitlines()
    assert all(len(line) > 60 for line in description[:-1]), description


def test_plan_warns_of_ceiling_values_that_make_no_sense_in_json_and_in_the_table(tmp_path):
    (tmp_path / "c.yaml").write_text("bestEffortCeiling: {enabled: true, headroom: 100Gi}\n")
    (tmp_path / "pods.json").write_text('{"kind": "PodList", "items": []}')
    want = ("bestEffortCeiling.headroom: 100Gi leaves less than bestEffortCeiling.minimum 64Mi of allocatable 7.9Gi"
            " even with no requests: every BestEffort pod together gets the minimum, whatever the others request")
    common = ("plan", "--pods", str(tmp_path / "pods.json"), "--config", str(tmp_path / "c.yaml"), "--node-memory", "8Gi")
    p = cli(*common, "--output", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["warnings"] == [want]
    table = cli(*common, "--output", "table").stdout.decode()
    assert f"  - {want}" in table.replace("\n    ", " ").splitlines()  # wrapped to 100 columns
    assert all(len(line) <= 100 for line in table.splitlines())


# issue 33, item 7: the table fits 100 columns with the longest names Kubernetes allows.
def _longest_names_pods(tmp_path: Path, pod_name: str = "p" * 253, container: str = "c" * 63) -> Path:
    pod = _odd_pod(pod_name, "1Gi", "2Gi")
    pod["metadata"]["namespace"] = "n" * 63
    pod["spec"]["containers"][0]["name"] = container
    pod["status"]["containerStatuses"][0].update(name=container, state={"running": {}})
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": [pod]}))
    return path


@pytest.mark.parametrize("ceiling", [False, True])
def test_the_table_fits_100_columns_with_the_longest_names_json_keeps_them_whole(tmp_path, ceiling):
    pods = _longest_names_pods(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(f"bestEffortCeiling: {{enabled: {str(ceiling).lower()}}}\n")
    for columns_env in ("40", "300"):  # the terminal's width plays no part
        p = cli("plan", "--pods", str(pods), *NODE, "--config", str(config), "--output", "table",
                env={"COLUMNS": columns_env})
        assert p.returncode == 0, p.stderr
        table = p.stdout.decode().split("\n\n")[1].splitlines()
        assert max(len(line) for line in table) <= 100, "\n".join(table)
        # cut in the middle: the namespace's head, the name's tail
        assert any(line.startswith(f"      {'c' * 10}") and f"…{'c' * 10}" in line for line in table), table
        assert any(line.startswith(f"    {'n' * 10}") and "n…p" in line and f"{'p' * 10}  pod" in line
                   for line in table), table
        assert "names cut to fit 100 columns" in p.stdout.decode()
    doc = json.loads(cli("plan", "--pods", str(pods), *NODE, "--config", str(config), "--output", "json").stdout)
    assert {u.get("pod") for u in doc["units"]} >= {f"{'n' * 63}/{'p' * 253}"}
    assert {u.get("container") for u in doc["units"]} >= {"c" * 63}


@pytest.mark.parametrize("env", [ASCII, {"PYTHONIOENCODING": "latin-1"}], ids=["LANG=C", "latin-1"])
def test_escaped_names_stay_in_their_columns(env, tmp_path):
    """A name the output's encoding cannot hold is printed as escapes (\\u4e2d): the columns are
    measured on what is printed, and a cut name ends in "..." there, not in an escaped "…"."""
    pods = tmp_path / "pods.json"
    short = _odd_pod("中文-pod", "1Gi", "2Gi")
    long = _odd_pod("中文" * 40, "1Gi", "2Gi")
    long["metadata"]["uid"] = "1b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b0c"
    long["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "cd" * 32
    pods.write_text(json.dumps({"kind": "PodList", "items": [short, long]}))
    p = cli("plan", "--pods", str(pods), *NODE, "--output", "table", env=env)
    assert p.returncode == 0, p.stderr
    table = p.stdout.decode("latin-1").split("\n\n")[1].splitlines()
    level_at = {line.index(" pod ") for line in table if " pod " in line}
    assert len(level_at) == 1, "\n".join(table)  # the LEVEL column starts at one place on every pod row
    assert max(len(line) for line in table) <= 100
    assert any("\\u4e2d\\u6587-pod" in line for line in table)
    assert any("..." in line for line in table if "\\u4e2d\\u6587\\u4e2d" in line)  # "…" would print as \\u2026
