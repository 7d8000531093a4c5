"""A bounded, seeded fuzz run for CI (issue 7): 2,000 hostile inputs, the same ones every run.

Hypothesis only hands out seeds here (`derandomize=True`, no example database, a fixed
`max_examples` per test); each seed drives `random.Random` through the same value pools as
tests/unit/test_hostile_input.py, which builds a document in microseconds where a
Hypothesis-built one costs tens of milliseconds. Every input goes through the same checks as
there (`check_pipeline`, `check_config`, `assert_ours`). A failure prints the seed; rerun it with
`build_document(random.Random(seed))`.

The budget (BUDGET) is the figure "inputs tried" in docs/RELIABILITY.md; `test_budget_was_spent`
fails if a run tried fewer inputs than it claims. Change both together, by hand.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections import Counter

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memqos_systemd.naming import Naming, container_scope
from memqos_systemd.pods import PodsError, parse_pods
from memqos_systemd.plan import NodeFacts, PlanError, plan
from memqos_systemd.sources import SourceError
from memqos_systemd.sources.file import FileSource

from test_hostile_input import (  # noqa: I100 - tests/unit is on sys.path (rootdir conftest)
    BASE_UID, CGROUPS, CID_NEAR_MISSES, CONFIG_KEYS, CONFIGS, FOREIGN_UNITS, HEX, KEYS, NAME_PARTS, NASTY_TEXT,
    NON_STR_JUNK, QUANTITY_TEXT, UID_NEAR_MISSES, Gi, assert_ours, check_config, check_pipeline,
)
from prereq import require

BUDGET = {"pod_documents": 900, "hostile_identities": 300, "configs": 400, "pods_file_bytes": 250,
          "unit_names": 150}
TRIED: Counter = Counter()
SEEDS = st.integers(0, 2**64 - 1)


def fuzz_settings(name: str):
    return settings(max_examples=BUDGET[name], derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


# ------------------------------------------------------------------ random.Random generators

GOOD_QUANTITIES = ["64Mi", "256Mi", "1Gi", "1.5Gi", "100M", "0", "1e9", "500m", "2Gi", 134217728, 0, 1]
RUNTIMES = ["containerd", "cri-o", "docker"]
MISSING = object()


def r_text(rng: random.Random) -> str:
    roll = rng.randrange(4)
    if roll == 0:
        return rng.choice(NASTY_TEXT)
    if roll == 1:  # any code point, surrogates and NUL included
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(12)))
    if roll == 2:
        return "".join(rng.choice("0123456789abcdef-_/.\n\x00") for _ in range(rng.randrange(70)))
    return "".join(rng.choice("abcXYZ-_.:/ \t\u00fc\u202e") for _ in range(rng.randrange(20)))


def r_junk(rng: random.Random, depth: int = 0):
    roll = rng.randrange(7)
    if roll <= 1:
        return copy.deepcopy(rng.choice(NON_STR_JUNK))
    if roll == 2:
        return r_text(rng)
    if roll == 3:
        return rng.choice([rng.randint(-2**80, 2**80), rng.uniform(-1e300, 1e300), float(rng.choice(["nan", "inf"]))])
    if depth < 3 and roll == 4:
        return [r_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and roll == 5:
        return {rng.choice(KEYS): r_junk(rng, depth + 1) for _ in range(rng.randrange(4))}
    return rng.choice(NASTY_TEXT)


def r_non_str(rng: random.Random):
    while True:
        value = r_junk(rng)
        if not isinstance(value, str):
            return value


def r_uid(rng: random.Random, good: bool):
    if good:
        roll = rng.randrange(3)
        if roll == 0:
            return rng.choice([BASE_UID, "8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e", "f" * 32])  # duplicates
        return str(uuid.UUID(int=rng.getrandbits(128))) if roll == 1 else f"{rng.getrandbits(128):032x}"
    return rng.choice([rng.choice(UID_NEAR_MISSES), r_text(rng), r_non_str(rng)])


def r_cid(rng: random.Random, good: bool):
    if good:
        return f"{rng.choice(RUNTIMES)}://{rng.getrandbits(256):064x}"
    return rng.choice([rng.choice(CID_NEAR_MISSES), r_text(rng), r_non_str(rng)])


def r_quantity(rng: random.Random, good: bool):
    if good:
        return rng.choice(GOOD_QUANTITIES)
    return rng.choice([rng.choice(QUANTITY_TEXT), rng.randint(-2**70, 2**70), rng.choice([2**63 - 1, 2**63, 2**64]),
                       rng.uniform(-1e20, 1e20), r_junk(rng)])


class Gen:
    """One document's worth of choices: `h` percent of the fields are hostile or missing."""

    def __init__(self, rng: random.Random, h: int, hostile_names: bool):
        self.rng, self.h, self.hostile_names = rng, h, hostile_names

    def bad(self) -> bool:
        return self.rng.randrange(100) < self.h

    def put(self, d: dict, key: str, good, bad=None) -> None:
        """d[key] = good() usually; else bad() (junk by default) or nothing."""
        if not self.bad():
            d[key] = good()
        elif self.rng.randrange(2):
            d[key] = bad() if bad else r_junk(self.rng)

    def resources(self) -> dict:
        rl = {}
        for name in ("memory", "cpu"):
            if self.rng.randrange(5):
                self.put(rl, name, lambda: r_quantity(self.rng, True), lambda: r_quantity(self.rng, False))
        return rl

    def container(self, j: int) -> dict:
        c: dict = {"image": "x"}
        self.put(c, "name", lambda: f"c{j}", (lambda: r_text(self.rng)) if self.hostile_names
                 else (lambda: self.rng.choice(["", r_non_str(self.rng)])))
        res: dict = {}
        self.put(res, "requests", self.resources)
        if self.rng.randrange(2):
            self.put(res, "limits", self.resources)
        self.put(c, "resources", lambda: res)
        if self.rng.randrange(4) == 0:
            c["restartPolicy"] = self.rng.choice(["Always", "Never", r_junk(self.rng)])
        return c

    def statuses(self, names: list) -> list:
        out = []
        for name in names:
            if self.rng.randrange(5) == 0:
                continue
            s: dict = {}
            self.put(s, "name", lambda: name)
            self.put(s, "containerID", lambda: r_cid(self.rng, True), lambda: r_cid(self.rng, False))
            self.put(s, "state", lambda: self.rng.choice([{"running": {}}, {"running": {}}, {"waiting": {}}, {}]))
            out.append(s)
        return out

    def pod(self, i: int):
        rng = self.rng
        meta: dict = {}
        if self.hostile_names:
            meta["name"] = rng.choice([r_text(rng), r_text(rng), f"p{i}", r_non_str(rng)])
            meta["namespace"] = rng.choice([r_text(rng), "ns", r_non_str(rng), MISSING])
        else:
            self.put(meta, "name", lambda: "NAME", lambda: rng.choice(["", r_non_str(rng)]))
            self.put(meta, "namespace", lambda: "ns", lambda: r_non_str(rng))
        self.put(meta, "uid", lambda: r_uid(rng, True), lambda: r_uid(rng, False))
        meta = {k: v for k, v in meta.items() if v is not MISSING}
        app = [self.container(j) for j in range(rng.randrange(4))]
        init = [self.container(10 + j) for j in range(rng.randrange(2))]
        spec: dict = {}
        self.put(spec, "containers", lambda: app)
        if init:
            self.put(spec, "initContainers", lambda: init)
        if rng.randrange(4) == 0:
            self.put(spec, "overhead", lambda: {"memory": r_quantity(rng, True)})
        if rng.randrange(6) == 0:
            self.put(spec, "resources", lambda: {"requests": self.resources(), "limits": self.resources()})
        status: dict = {}
        self.put(status, "phase", lambda: rng.choice(["Running"] * 3 + ["Pending", "Succeeded", "Failed", "Unknown"]))
        self.put(status, "qosClass", lambda: rng.choice(["Guaranteed", "Burstable", "BestEffort", ""]),
                 lambda: rng.choice(["Gold", "guaranteed", r_junk(rng)]))
        self.put(status, "containerStatuses",
                 lambda: self.statuses([c["name"] for c in app if isinstance(c.get("name"), str)]))
        if init:
            self.put(status, "initContainerStatuses",
                     lambda: self.statuses([c["name"] for c in init if isinstance(c.get("name"), str)]))
        item: dict = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
        for key in ("metadata", "spec", "status"):
            if rng.randrange(100) < self.h // 3:
                if rng.randrange(2):
                    item[key] = r_junk(rng)
                else:
                    del item[key]
        if self.h:
            self.mutate(item)
            if rng.randrange(100) < self.h // 4:
                return r_junk(rng)
        return item

    def mutate(self, obj) -> None:
        from test_hostile_input import _paths, nested
        for _ in range(self.rng.randrange(4)):
            paths = list(_paths(obj))
            if not paths:
                return
            path = self.rng.choice(paths)
            parent = obj
            for k in path[:-1]:
                parent = parent[k]
            key = path[-1]
            action = self.rng.choice(["junk", "junk", "delete", "deep", "stringify"])
            if action == "delete":
                del parent[key]
            elif action == "deep":
                parent[key] = nested(self.rng.randrange(1, 150), parent[key])
            elif action == "stringify":
                parent[key] = str(parent[key])[:200]
            else:
                parent[key] = r_junk(self.rng)


def build_document(rng: random.Random, hostile_names: bool = False):
    """(document, items or None) like test_hostile_input.pod_documents, from a seeded Random."""
    from test_hostile_input import traceable
    gen = Gen(rng, rng.choice([0, 0, 1, 2, 5, 10, 20, 40]), hostile_names)
    items = [gen.pod(i) for i in range(rng.randrange(7))]
    if not hostile_names:
        items = traceable(items)
    shape = rng.choice(["PodList", "PodList", "PodList", "List", "items", "bare", "one", "junk"])
    if shape == "junk":
        return r_junk(rng), None
    if shape == "bare":
        return items, items
    if shape == "one" and len(items) == 1 and isinstance(items[0], dict):
        return items[0], items
    doc = {"items": items}
    if shape != "items":
        doc = {"apiVersion": "v1", "kind": "PodList" if shape == "one" else shape, **doc}
    return doc, items


def build_node(rng: random.Random) -> NodeFacts:
    if rng.randrange(4):
        return NodeFacts(rng.choice([16 * Gi, 64 * Gi, 4 * Gi, 1 << 40]), rng.choice([4096, 65536]))
    return NodeFacts(rng.choice([1, 0, -1, 2**63, 2**64, rng.randint(-5, 2**66)]), rng.choice([4096, 1, 0, 3, -4096]))


def build_observed(rng: random.Random, units: list[str], naming) -> dict:
    def props():
        if rng.randrange(6) == 0:
            return None
        out = {}
        for key in ("MemoryMin", "MemoryLow", "MemoryHigh"):
            if rng.randrange(4):
                out[key] = rng.choice([0, 2**64 - 1, rng.getrandbits(64), 4096, rng.getrandbits(34)])
        if out.get("MemoryHigh") == 0:
            out["MemoryHigh"] = 1
        return out

    observed = {name: props() for name in units if rng.randrange(3)}
    for _ in range(rng.randrange(5)):
        roll = rng.randrange(4)
        if roll == 0:
            name = naming.pod_slice(rng.choice(["Guaranteed", "Burstable", "BestEffort"]),
                                    str(uuid.UUID(int=rng.getrandbits(128))))
        elif roll == 1:
            name = container_scope(r_cid(rng, True))
        elif roll == 2:
            name = rng.choice(FOREIGN_UNITS)
        else:
            name = r_text(rng)
        observed[name] = props()
    return observed


def run_document(seed: int, hostile_names: bool) -> None:
    rng = random.Random(seed)
    doc, items = build_document(rng, hostile_names)
    config = rng.choice(CONFIGS)
    node = build_node(rng)
    try:
        pods, _ = parse_pods(doc)
        units = [u.unit for u in plan(pods, node, config).units]
    except (PodsError, PlanError):
        units = []
    observed = build_observed(rng, units, Naming.for_config(config))
    check_pipeline(doc, items, config, node, observed, traced=not hostile_names)


# ------------------------------------------------------------------ the run

@fuzz_settings("pod_documents")
@given(seed=SEEDS)
def test_fuzz_pod_documents(seed):
    TRIED["pod_documents"] += 1
    run_document(seed, hostile_names=False)


@fuzz_settings("hostile_identities")
@given(seed=SEEDS)
def test_fuzz_hostile_identities(seed):
    TRIED["hostile_identities"] += 1
    run_document(seed, hostile_names=True)


CONFIG_VALUES = {
    "memoryReservationPolicy": ["None", "TieredReservation", "HardReservation", "none", "", "Tiered"],
    "memoryThrottlingFactor": [0, 1, 0.9, -0.1, 1.0000001, None, True, float("nan"), float("inf"), 1e-300],
    "hierarchy": ["effective", "kubelet", "Effective", ""],
    "cgroupRoot": CGROUPS,
    "kubeReserved": [{"memory": "1Gi"}, {"memroy": "1Gi"}, {"memory": "-1Gi"}, {"pid": "100"}, {"memory": 2**70}],
    "systemReserved": [{"memory": "512Mi"}, {"cpu": "x"}, {"memory": "9" * 41}, {}],
    "evictionHard": [{"memory.available": "100Mi"}, {"memory.available": "5%"}, {"memory.available": "100%"},
                     {"memory.available": "-1%"}, {"memory": "1Gi"}, {"nodefs.available": "10%"}],
    "enforceNodeAllocatable": [["pods"], ["pods", "kube-reserved"], ["pods", "system-reserved"], ["none"],
                               ["pods", "kube-reserved", "system-reserved"], ["x"], []],
    "kubeReservedCgroup": CGROUPS,
    "systemReservedCgroup": CGROUPS,
    "protectionHeadroom": ["5%", "99.99%", "100%", "0%", "1Gi", "-1Gi", "0"],
    "podsFile": ["/etc/pods.yaml", "pods.yaml", "", "/"],
    "kubelet": [{"url": "https://127.0.0.1:10250/pods"}, {"url": "ftp://x"}, {"pollInterval": "0s"},
                {"timeout": "301s"}, {"clientCertFile": "/c"}, {"insecureSkipTLSVerify": "yes"}, {"tokenFile": "t"}],
    "kubeletConfigFile": ["x", "relative.yaml"],
    "metrics": [None, {"listen": "0.0.0.0:1"}, {"listen": ":9759"}, {"listen": "x:65536"}, {"listen": False}],
    "resyncInterval": ["60s", "0.5s", "1s", "86401s", "1h", "1d", float("nan"), -1],
}


def build_config(rng: random.Random):
    """A config map: half the time a valid one with hostile cgroup names, else anything."""
    if rng.randrange(20) == 0:
        return r_junk(rng)
    if rng.randrange(2):
        doc = {"memoryReservationPolicy": rng.choice(["TieredReservation", "HardReservation", "None"]),
               "hierarchy": rng.choice(["effective", "kubelet"]),
               "enforceNodeAllocatable": ["pods", "kube-reserved", "system-reserved"],
               "kubeReserved": {"memory": "1Gi"}, "systemReserved": {"memory": "512Mi"},
               "kubeReservedCgroup": "/kube.slice", "systemReservedCgroup": "/system.slice"}
        for key in rng.sample(["cgroupRoot", "kubeReservedCgroup", "systemReservedCgroup"], rng.randrange(1, 4)):
            doc[key] = rng.choice(CGROUPS) if rng.randrange(3) else "/" + r_text(rng) + rng.choice([".slice", ""])
        return doc
    doc = {}
    for key in rng.sample(CONFIG_KEYS, rng.randrange(8)):
        if rng.randrange(5):
            value = copy.deepcopy(rng.choice(CONFIG_VALUES[key]))
            if key.endswith("Cgroup") and rng.randrange(4) == 0:
                value = "/" + r_text(rng) + ".slice"
            doc[key] = value
        else:
            doc[key] = r_junk(rng)
    if rng.randrange(10) == 0:
        doc[r_text(rng)] = r_junk(rng)
    return doc


@fuzz_settings("configs")
@given(seed=SEEDS)
def test_fuzz_configs(seed):
    TRIED["configs"] += 1
    check_config(build_config(random.Random(seed)))


YAML_FRAGMENTS = ["!!python/object/apply:os.system ['true']", "!!binary aGk=", "!!set {a}", "*ref", "&a x",
                  "<<: {}", "? [a]", "%YAML 1.1\n---\n", "---\n", "...\n", "\ufeff", "\x00", "\t", "{", "[", "'",
                  '"', "#", ": ", "- ", "\r\n", "2001-12-14", "0x1F", "1e400", "!!float", "!custom"]


def build_file_bytes(rng: random.Random) -> bytes:
    """A pods file as a person, a broken writer or an attacker leaves it: a good document in
    JSON or YAML, then cut short, bytes flipped, or a hostile YAML fragment spliced in."""
    doc, _ = build_document(rng)
    try:
        text = json.dumps(doc, indent=rng.choice([None, 2]), default=str) if rng.randrange(2) else yaml.safe_dump(doc)
    except (TypeError, ValueError, yaml.YAMLError, RecursionError):
        text = "[]"
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(rng.randrange(4)):
        roll = rng.randrange(4)
        if roll == 0 and data:
            data = data[: rng.randrange(len(data))]  # half-written
        elif roll == 1 and data:
            pos = rng.randrange(len(data))
            data = data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1:]
        elif roll == 2:
            pos = rng.randrange(len(data) + 1)
            data = data[:pos] + rng.choice(YAML_FRAGMENTS).encode() + data[pos:]
        else:
            data = data.replace(b": ", b": " + rng.choice(YAML_FRAGMENTS).encode() + b" ", 1)
    return data


@fuzz_settings("pods_file_bytes")
@given(seed=SEEDS)
def test_fuzz_pods_file_bytes(tmp_path_factory, seed):
    TRIED["pods_file_bytes"] += 1
    rng = random.Random(seed)
    path = tmp_path_factory.getbasetemp() / "fuzz-pods"
    path.write_bytes(build_file_bytes(rng))
    try:
        snap = FileSource(path).fetch()
    except SourceError as e:  # and nothing else (test_yaml_constructor_errors_are_source_errors)
        assert str(e).startswith(f"file {path}: ") and "\n" not in str(e)
        return
    config = rng.choice(CONFIGS)
    p = plan(list(snap.pods), NodeFacts(64 * Gi), config)
    naming = Naming.for_config(config)
    for u in p.units:
        assert_ours(u.unit, naming, config)


@fuzz_settings("unit_names")
@given(seed=SEEDS)
def test_fuzz_unit_names(seed):
    """Names as UnitNew/ListUnitsByPatterns might deliver them: near misses of ours."""
    TRIED["unit_names"] += 1
    rng = random.Random(seed)
    config = rng.choice(CONFIGS)
    naming = Naming.for_config(config)
    ours = [naming.node_slice(), *naming.root_slices(), naming.qos_slice("Burstable"),
            naming.pod_slice("Burstable", BASE_UID), container_scope(f"containerd://{HEX}")]
    for _ in range(20):
        name = rng.choice(ours)
        for _ in range(rng.randrange(1, 4)):
            roll = rng.randrange(4)
            pos = rng.randrange(len(name) + 1)
            if roll == 0:
                name = name[:pos] + rng.choice(NAME_PARTS) + name[pos:]
            elif roll == 1 and name:
                name = name[:pos] + name[pos + 1:]
            elif roll == 2:
                name = name[:pos] + chr(rng.randrange(0x20, 0x3000)) + name[pos:]
            else:
                name = "".join(rng.sample(NAME_PARTS, rng.randrange(1, 5)))
        if naming.parse_unit(name) is not None:
            assert_ours(name, naming, config)


def test_budget_was_spent():
    """The figure in docs/RELIABILITY.md: every fuzz test above ran its whole budget."""
    ran = {name: TRIED[name] for name in BUDGET if TRIED[name]}
    if not ran:
        require(False, "no fuzz test ran in this session")
    for name, count in ran.items():
        assert count == BUDGET[name], (name, count)
    if len(ran) == len(BUDGET):
        assert sum(ran.values()) == 2000
