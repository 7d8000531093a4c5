"""Hostile input through the whole pure path (issue 7, "Ownership").

Pods documents a kubelet, a careless operator or an attacker could hand us, and config maps
nobody should write, go through parse_pods -> plan -> diff (against an empty and a populated
observed state) -> reset_plan. Whatever comes in:

* nothing raises but the documented errors (PodsError, SourceError, ConfigError, PlanError;
  NamingError from `Naming.for_config`, which the daemon catches on reload);
* every unit name in every plan and every change is one `Naming.parse_unit` accepts, is
  spelled `^[A-Za-z0-9:_.\\-]+\\.(slice|scope)$`, is never `-.slice`, and is the kubepods tree
  (cgroupRoot's slices, kubepods*.slice, runtime scopes of planned pods) or a configured
  reserved slice; a pod or container unit is never created, only changed while loaded;
* every rejected pod is named in the warnings exactly once, and a pod that is neither planned
  nor warned about is a finished one (Succeeded/Failed).

The bugs these checks found (uint64 overflow, YAML constructor errors, unbounded or multi-line
warnings and config errors, slice names systemd refuses, backslashes) were fixed in 18703cc; the
tests at the end pin each one. What is still open is an `xfail(strict=True)` test there, and
the property checks tolerate exactly that (counted in `KNOWN`), so that fixing it turns its xfail
into a failure that says "remove the tolerance". docs/RELIABILITY.md lists them.

The strategies are shared with tests/unit/test_fuzz_bounded.py (the seeded CI run).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import re
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memqos_systemd.config import HIERARCHIES, POLICIES, Config, ConfigError, load_config, parse_config
from memqos_systemd.naming import RUNTIME_SCOPE_PREFIX, Naming, NamingError, container_scope, reserved_slice
from memqos_systemd.plan import INFINITY, NodeFacts, PlanError, plan
from memqos_systemd.pods import PodsError, parse_pods
from memqos_systemd.reconcile import DEFAULTS, MAY_CREATE, diff, reset_plan
from memqos_systemd.sources import MAX_RESPONSE_BYTES, SourceError, snapshot_from_doc
from memqos_systemd.sources.file import FileSource
from memqos_systemd.systemd import UINT64_MAX, describe_call

Mi, Gi = 2**20, 2**30
UNIT_RE = re.compile(r"[A-Za-z0-9:_.\-]+\.(slice|scope)")
SCOPE_RE = re.compile(r"(cri-containerd|crio|docker)-[0-9a-f]{64}\.scope")
DONE = ("Succeeded", "Failed")
HEX = "0123456789abcdef" * 4
BASE_UID = "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c"


# ------------------------------------------------------------------ hostile values

NASTY_TEXT = [
    "", " ", "/", "//", ".", "..", "../..", "../../system.slice", "-", "--", "-.slice", ".slice",
    "a.service", ".service", "kubepods.slice", "kubepods-burstable.slice", "system.slice", "init.scope",
    "\n", "a\nb", "a\r\nb", "\x00", "a\x00b", "\t", "\u202e", "\u00fc", "\U0001f600", "\udcff", "x" * 10_000,
    "0" * 64, "f" * 32, "%s%n", "${jndi:x}", "'", '"', "\\", "a\\x2db", "*", "?", "[a-z]",
]
UID_NEAR_MISSES = [
    BASE_UID.upper(), BASE_UID.replace("-", "_"), BASE_UID + "/", "/" + BASE_UID, BASE_UID + ".slice",
    BASE_UID + "\n", BASE_UID + "\x00", BASE_UID[:-1], BASE_UID + "0", "../" + BASE_UID, "-" * 36,
    BASE_UID.replace("-", "/"), "\u00fc" + BASE_UID[1:], BASE_UID.replace("a", "\uff41"), " " + BASE_UID,
    BASE_UID[:8] + "-..-" + BASE_UID[13:], BASE_UID + "-" + BASE_UID, "0" * 31, "0" * 33, "g" * 32,
    BASE_UID.replace("-", "") + ".service", "kubepods-pod" + BASE_UID, BASE_UID.replace("-", "-\n"),
]
CID_NEAR_MISSES = [
    f"containerd://{HEX}/../../x", f"containerd://{HEX.upper()}", f"containerd://{HEX[:-1]}",
    f"containerd://{HEX}0", "containerd://../../../etc/passwd", f"containerd:///{HEX}", f"rkt://{HEX}",
    f"containerd://{HEX}\n", f"cri-o://{HEX}.scope", "docker://" + "-" * 64, f"containerd://{HEX}.service",
    f"containerd:/{HEX}", f"Containerd://{HEX}", f"containerd://{HEX}\x00", f"containerd://cri-containerd-{HEX}.scope",
    HEX, f"://{HEX}", f"containerd://containerd://{HEX}", f"docker://{HEX[:32]}-{HEX[32:]}", "containerd://",
    f"containerd://{HEX[:32]}/{HEX[33:]}", f"cri-o://{HEX[:-1]}\u0660", f"docker://{HEX} ",
]
QUANTITY_TEXT = [
    "1Gi", "256Mi", "0", "-1", "-1Gi", "0.5", "1.5Gi", "1e30", "1e31", "1e-30", "9" * 41, "9" * 40, "NaN",
    "nan", "Inf", "-Inf", "0x10", "1 Gi", " 1Gi", "1Gi\n", "+1Gi", ".5", "5.", "1m", "1Ei", "8Ei", "16Ei",
    "9223372036854775807", "9223372036854775808", "18446744073709551615", "18446744073709551616",
    "1e308", "1E3", "1e", "e3", "Gi", "1GiB", "1gi", "\uff11Gi", "1_000", "", "-0", "0.0000001",
]
KEYS = ["kind", "items", "metadata", "spec", "status", "name", "uid", "namespace", "containers",
        "initContainers", "resources", "requests", "limits", "memory", "cpu", "phase", "qosClass",
        "containerStatuses", "initContainerStatuses", "containerID", "state", "running", "restartPolicy",
        "allocatedResources", "conditions", "reason", "resize", "PodResizePending",
        "overhead", "x"]




def nested(depth: int, leaf=None):
    """A list/dict nest `depth` deep, built without recursion."""
    value = leaf
    for d in range(depth):
        value = [value] if d % 2 else {"spec": value}
    return value


# Values of every type JSON and safe YAML can produce (bytes, sets and dates come from the YAML
# tags !!binary, !!set and timestamps), to put where a string, a number or a map belongs.
# Drawn with sampled_from (cheap) and deep-copied, because the documents are edited in place.
NON_STR_JUNK = [
    None, True, False, 0, -1, 1, 2**63, -2**63, 2**64, 10**30, 1.5, -0.0, math.nan, math.inf, -math.inf, 1e308,
    [], [None], [[[]]], ["containerd://" + HEX], [{"name": "c"}], {}, {"x": 1}, {"memory": "1Gi"},
    {"running": {}}, {"metadata": {"name": "n"}}, {1: 2}, {None: "x"}, nested(50), nested(200, "x"), b"\xff\x00",
    set(), {"a", "b"}, datetime.date(2001, 12, 14), datetime.datetime(2001, 12, 14, 21, 59, 43),
]
hostile_text = st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=30),
                         st.text(alphabet="0123456789abcdef-_/.\n\x00", max_size=70))
non_str = st.one_of(st.sampled_from(NON_STR_JUNK).map(copy.deepcopy), st.integers(-2**80, 2**80), st.floats())
junk = st.one_of(non_str, hostile_text,
                 st.lists(st.one_of(hostile_text, non_str), max_size=3),
                 st.dictionaries(st.sampled_from(KEYS), st.one_of(hostile_text, non_str), max_size=3))

valid_uids = st.one_of(st.sampled_from([str(uuid.UUID(int=i * 0x9E3779B97F4A7C15 + 1)) for i in range(4)]),
                       st.uuids().map(str), st.binary(min_size=16, max_size=16).map(bytes.hex))
uids = st.one_of(valid_uids, valid_uids, valid_uids, st.sampled_from(UID_NEAR_MISSES), hostile_text, non_str)
valid_cids = st.builds(lambda rt, h: f"{rt}://{h}", st.sampled_from(sorted(RUNTIME_SCOPE_PREFIX)),
                       st.binary(min_size=32, max_size=32).map(bytes.hex))
cids = st.one_of(valid_cids, valid_cids, valid_cids, st.sampled_from(CID_NEAR_MISSES), hostile_text, non_str)
quantities = st.one_of(
    st.sampled_from(QUANTITY_TEXT), st.sampled_from(QUANTITY_TEXT), st.integers(-2**70, 2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, 0, 10**30]), st.floats(),
    st.text(max_size=8), junk)

_MISSING = object()
# How often a property run met a known, still open bug (tolerated there, pinned by an xfail below).
KNOWN: Counter = Counter()


def _pick(draw, good, bad, hostility: int, missing=True):
    """good, or with `hostility` percent chance something hostile or nothing (_MISSING)."""
    roll = draw(st.integers(0, 99))
    if roll >= hostility:
        return draw(good)
    if roll < hostility // 2 or not missing:
        return draw(bad)
    return _MISSING


def _put(d: dict, key: str, value) -> None:
    if value is not _MISSING:
        d[key] = value


good_quantities = st.one_of(st.sampled_from(["64Mi", "256Mi", "1Gi", "1.5Gi", "100M", "0", "1e9", "500m", "2Gi"]),
                            st.integers(0, 64 * Gi))


@st.composite
def resource_lists(draw, h: int):
    rl = {}
    for name in ("memory", "cpu"):
        if draw(st.integers(0, 4)):
            _put(rl, name, _pick(draw, good_quantities, quantities, h))
    return rl


@st.composite
def containers(draw, j: int, hostile_names: bool, h: int):
    c: dict = {"image": "x"}
    name_bad = hostile_text if hostile_names else st.one_of(st.just(""), non_str)
    _put(c, "name", _pick(draw, st.just(f"c{j}"), name_bad, h))
    res: dict = {}
    _put(res, "requests", _pick(draw, resource_lists(h), junk, h))
    if draw(st.booleans()):
        _put(res, "limits", _pick(draw, resource_lists(h), junk, h))
    _put(c, "resources", _pick(draw, st.just(res), junk, h))
    if draw(st.integers(0, 3)) == 0:
        c["restartPolicy"] = draw(st.one_of(st.just("Always"), st.just("Never"), junk))
    return c


@st.composite
def statuses(draw, names: list, h: int):
    out = []
    for name in names:
        if draw(st.integers(0, 4)) == 0:
            continue
        s: dict = {}
        _put(s, "name", _pick(draw, st.just(name), junk, h))
        _put(s, "containerID", _pick(draw, valid_cids, cids, h))
        state = draw(st.sampled_from([{"running": {"startedAt": "x"}}, {"running": {}}, {"running": {}},
                                      {"waiting": {}}, {"terminated": {}}, {}]))
        _put(s, "state", _pick(draw, st.just(state), junk, h))
        if draw(st.integers(0, 2)) == 0:  # what the kubelet allocated and enacted (in-place resize)
            _put(s, "allocatedResources", _pick(draw, resource_lists(h), junk, h))
            _put(s, "resources", _pick(draw, st.fixed_dictionaries({"requests": resource_lists(h),
                                                                     "limits": resource_lists(h)}), junk, h))
        out.append(s)
    return out


@st.composite
def resize_conditions(draw, h: int):
    """Pod conditions as a v1.33+ kubelet reports them, resize ones included."""
    out = [{"type": "Ready", "status": "True"}]
    for kind in draw(st.lists(st.sampled_from(["PodResizePending", "PodResizeInProgress"]), max_size=2)):
        c: dict = {"type": kind, "status": draw(st.sampled_from(["True", "True", "False", "Unknown"]))}
        _put(c, "reason", _pick(draw, st.sampled_from(["Deferred", "Infeasible", "Error", ""]), junk, h))
        out.append(c)
    return out


@st.composite
def pod_items(draw, i: int, hostile_names: bool, h: int):
    """One Pod (as the kubelet's /pods has it), `h` percent hostile in every field. With
    hostile_names False the name is left for `traceable` to set, so each item can be found in
    the warnings."""
    meta: dict = {}
    if hostile_names:
        _put(meta, "name", _pick(draw, st.one_of(hostile_text, st.just(f"p{i}")), non_str, max(h, 50)))
        _put(meta, "namespace", _pick(draw, st.one_of(hostile_text, st.just("ns")), non_str, max(h, 50)))
    else:
        _put(meta, "name", _pick(draw, st.just("NAME"), st.one_of(st.just(""), non_str), h))
        _put(meta, "namespace", _pick(draw, st.just("ns"), non_str, h))
    _put(meta, "uid", _pick(draw, valid_uids, uids, h))
    spec: dict = {}
    app = [draw(containers(j, hostile_names, h)) for j in range(draw(st.integers(0, 3)))]
    init = [draw(containers(10 + j, hostile_names, h)) for j in range(draw(st.integers(0, 1)))]
    _put(spec, "containers", _pick(draw, st.just(app), junk, h))
    if init:
        _put(spec, "initContainers", _pick(draw, st.just(init), junk, h))
    if draw(st.integers(0, 3)) == 0:
        _put(spec, "overhead", _pick(draw, st.fixed_dictionaries({"memory": good_quantities}), junk, h))
    if draw(st.integers(0, 5)) == 0:
        _put(spec, "resources", _pick(draw, st.fixed_dictionaries({"requests": resource_lists(h),
                                                                     "limits": resource_lists(h)}), junk, h))
    status: dict = {}
    _put(status, "phase", _pick(draw, st.sampled_from(["Running", "Running", "Running", "Pending", "Succeeded",
                                                       "Failed", "Unknown"]), junk, h))
    _put(status, "qosClass", _pick(draw, st.sampled_from(["Guaranteed", "Burstable", "BestEffort", ""]),
                                   st.one_of(st.sampled_from(["Gold", "guaranteed", "Guaranteed\n"]), junk), h))
    names = [c.get("name") for c in app if isinstance(c.get("name"), str)]
    init_names = [c.get("name") for c in init if isinstance(c.get("name"), str)]
    _put(status, "containerStatuses", _pick(draw, statuses(names, h), junk, h))
    if init_names:
        _put(status, "initContainerStatuses", _pick(draw, statuses(init_names, h), junk, h))
    if draw(st.integers(0, 2)) == 0:  # a resize: conditions, the older status.resize, pod-level values
        _put(status, "conditions", _pick(draw, resize_conditions(h), junk, h))
        if draw(st.booleans()):
            _put(status, "resize", _pick(draw, st.sampled_from(["Proposed", "InProgress", "Deferred", "Infeasible", ""]),
                                         junk, h))
        if draw(st.booleans()):
            _put(status, "allocatedResources", _pick(draw, resource_lists(h), junk, h))
            _put(status, "resources", _pick(draw, st.fixed_dictionaries({"requests": resource_lists(h),
                                                                          "limits": resource_lists(h)}), junk, h))
    item: dict = {"apiVersion": "v1", "kind": "Pod"}
    _put(item, "metadata", _pick(draw, st.just(meta), junk, h // 3))
    _put(item, "spec", _pick(draw, st.just(spec), junk, h // 3))
    _put(item, "status", _pick(draw, st.just(status), junk, h // 3))
    if h:
        item = draw(mutated(item))
        if draw(st.integers(0, 99)) < h // 4:
            return draw(junk)  # not a Pod at all
    return item


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


@st.composite
def mutated(draw, obj):
    """Up to three hostile edits anywhere: a value replaced by junk, deleted, nested deep, or
    turned into another type."""
    for _ in range(draw(st.integers(0, 3))):
        paths = list(_paths(obj))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        action = draw(st.sampled_from(["junk", "junk", "delete", "deep", "stringify"]))
        if action == "delete":
            del parent[key]
        elif action == "deep":
            parent[key] = nested(draw(st.integers(1, 150)), parent[key])
        elif action == "stringify":
            parent[key] = str(parent[key])[:200]
        else:
            parent[key] = draw(junk)
    return obj


def traceable(items: list) -> list:
    """Name item i `tok{i}z` in namespace `ns` wherever it has a string name, so the warnings
    about it can be told apart from the others'."""
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if isinstance(meta, dict):
            if isinstance(meta.get("name"), str) and meta["name"] != "":
                meta["name"] = f"tok{i}z"
            if isinstance(meta.get("namespace"), str):
                meta["namespace"] = "ns"
    return items


@st.composite
def pod_documents(draw, hostile_names: bool = False):
    """(document, items): a PodList / List / bare list / one Pod, or (rarely) anything at all
    (items None: which item is which cannot be told)."""
    n = draw(st.integers(0, 6))
    h = draw(st.sampled_from([0, 2, 5, 5, 10, 20, 40]))
    items = [draw(pod_items(i, hostile_names, h)) for i in range(n)]
    if not hostile_names:
        items = traceable(items)
    shape = draw(st.sampled_from(["PodList", "PodList", "PodList", "List", "items", "bare", "one", "junk"]))
    if shape == "junk":
        return draw(junk), None
    if shape == "bare":
        return items, items
    if shape == "one":
        if len(items) == 1 and isinstance(items[0], dict):
            return items[0], items
        shape = "PodList"
    doc = {"items": items}
    if shape != "items":
        doc = {"apiVersion": "v1", "kind": shape, **doc}
    return doc, items


# ------------------------------------------------------------------ configs and nodes

def _config(policy, hierarchy, root, reserved, factor):
    doc = {"memoryReservationPolicy": policy, "hierarchy": hierarchy, "cgroupRoot": root,
           "memoryThrottlingFactor": factor}
    if reserved:
        doc.update({"enforceNodeAllocatable": ["pods", *reserved], "kubeReserved": {"memory": "1Gi"},
                    "systemReserved": {"memory": "512Mi"}})
        if "kube-reserved" in reserved:
            doc["kubeReservedCgroup"] = "/kube.slice" if root == "/" else "/kube-reserved.slice"
        if "system-reserved" in reserved:
            doc["systemReservedCgroup"] = "/system.slice"
    return parse_config(doc)


CONFIGS = [
    _config(policy, hierarchy, root, reserved, factor)
    for policy in POLICIES for hierarchy in HIERARCHIES
    for root, reserved, factor in (("/", (), 0.9), ("/", ("kube-reserved", "system-reserved"), None),
                                   ("/foo.slice/foo-bar.slice", ("system-reserved",), 1.0),
                                   ("/a/b_c", ("kube-reserved",), 0.5), ("/kube-root", (), 1e-9))
]
configs = st.sampled_from(CONFIGS)
good_nodes = st.builds(NodeFacts, capacity=st.sampled_from([16 * Gi, 64 * Gi, 4 * Gi, 1 << 40]),
                       page_size=st.sampled_from([4096, 65536]))
nodes = st.one_of(good_nodes, good_nodes, good_nodes, st.builds(
    NodeFacts, capacity=st.one_of(st.sampled_from([1, 0, -1, 2**63, 2**64]), st.integers(-5, 2**66)),
    page_size=st.sampled_from([4096, 1, 0, 3, -4096])))


# ------------------------------------------------------------------ the checks

@dataclass
class Outcome:
    stage: str  # where it stopped: "pods" (PodsError), "plan" (PlanError), "done"
    pods: int = 0
    units: int = 0
    changes: int = 0
    warnings: int = 0


def allowed_names(naming: Naming, config: Config) -> tuple[set, set]:
    """(fixed names of ours: cgroupRoot slices, kubepods.slice; the configured reserved slices)."""
    reserved = set()
    if "kube-reserved" in config.enforce_node_allocatable and config.kube_reserved_cgroup:
        reserved.add(reserved_slice(config.kube_reserved_cgroup))
    if "system-reserved" in config.enforce_node_allocatable and config.system_reserved_cgroup:
        reserved.add(reserved_slice(config.system_reserved_cgroup))
    return {naming.node_slice(), *naming.root_slices()}, reserved


def assert_ours(name, naming: Naming, config: Config) -> None:
    """The one rule of issue 7: a name we touch is ours by our own naming rules."""
    fixed, reserved = allowed_names(naming, config)
    assert isinstance(name, str), name
    assert naming.parse_unit(name) is not None, f"{name!r} is not one of ours"
    assert name != "-.slice"
    assert UNIT_RE.fullmatch(name), f"{name!r} is not spelled like one of our units"
    prefix = naming.node_slice()[: -len(".slice")]
    assert (name in fixed or name in reserved or SCOPE_RE.fullmatch(name)
            or (name.startswith(prefix + "-") and name.endswith(".slice"))), f"{name!r} is outside the kubepods tree"


def check_values(unit: str, props) -> None:
    """What the adapter would send: it accepts every name and value (describe_call validates as
    set_memory does; test_planned_values_fit_in_uint64)."""
    for key, value in props.items():
        assert isinstance(value, int) and not isinstance(value, bool), (unit, key, value)
        assert 0 <= value <= UINT64_MAX, (unit, key, value)
    describe_call(unit, dict(props))


REJECTION = re.compile(r"^pod (#\d+|[^\n]+?): .*(; pod skipped|; later copy skipped|; not planned)$", re.S)


def _name_of(item):
    meta = item.get("metadata") if isinstance(item, dict) else None
    return meta.get("name") if isinstance(meta, dict) else None


def _rejections_of(warnings, i: int) -> list[str]:
    token = f"tok{i}z"
    heads = (f"pod #{i}: ", *(f"pod {ns}/{token}: " for ns in ("ns", "default")))
    return [w for w in warnings if REJECTION.match(w) and w.startswith(heads)]


def check_pipeline(doc, items, config: Config, node: NodeFacts, observed_extra=None,
                   traced: bool = True) -> Outcome:
    """parse_pods -> plan -> diff (empty, populated) -> reset_plan, with every check of this module."""
    try:
        pods, parse_warnings = parse_pods(doc)
    except PodsError as e:
        assert "\n" not in str(e)
        with pytest.raises(SourceError):
            snapshot_from_doc(doc, "fuzz", 0.0)
        return Outcome("pods")
    assert all(isinstance(w, str) for w in parse_warnings)
    # The source's view agrees: garbage is an error, never an empty node.
    try:
        snap = snapshot_from_doc(doc, "fuzz", 0.0)
        assert list(snap.pods) == pods and list(snap.warnings) == parse_warnings
    except SourceError as e:
        assert not pods and parse_warnings, e
    try:
        p = plan(pods, node, config)
    except PlanError as e:
        assert "\n" not in str(e)
        # Only the node facts can make a plan impossible with these (valid) configs.
        assert node.capacity <= 0 or node.page_size <= 0 or node.page_size & (node.page_size - 1) \
            or node.capacity < config.kube_reserved + config.system_reserved \
            + config.eviction_hard_memory.resolve(node.capacity), e
        return Outcome("plan", len(pods))
    naming = Naming.for_config(config)
    warnings = [*parse_warnings, *p.warnings]

    # --- the plan: our names only, a tree, values systemd takes.
    seen: dict[str, str] = {}
    for u in p.units:
        assert_ours(u.unit, naming, config)
        assert u.unit not in seen, f"{u.unit} planned twice"
        ref = naming.parse_unit(u.unit)
        assert ref.level == u.level, (u.unit, ref, u.level)
        if u.parent is not None:
            assert u.parent in seen, f"{u.unit}: parent {u.parent} not planned before it"
            parent_level = seen[u.parent]
            assert {"container": ("pod",), "pod": ("qos", "node"), "qos": ("node",), "node": ("node",),
                    "reserved": ()}[u.level].__contains__(parent_level), (u.unit, u.level, parent_level)
        elif u.level in ("pod", "container", "qos"):
            raise AssertionError(f"{u.unit}: a {u.level} unit without a parent")
        seen[u.unit] = u.level
        check_values(u.unit, u.properties())
        assert u.memory_high >= 1

    # --- the diff, against nothing and against a populated, partly foreign state.
    planned = p.by_unit()
    for observed in ({}, observed_extra or {}):
        for c in diff(p, observed, naming):
            assert_ours(c.unit, naming, config)
            have = observed.get(c.unit)
            if c.unit not in planned:
                # An orphan: ours, loaded, at pod/container level, and only ever reset.
                assert have is not None and naming.parse_unit(c.unit).level in ("pod", "container"), c
                assert all(DEFAULTS[k] == v for k, v in c.props.items()), c
            if have is None:
                assert c.level in MAY_CREATE, f"{c.unit} would be created"
            assert c.must_exist == (c.level not in MAY_CREATE)
            assert c.props, c
            check_values(c.unit, c.props)
        for c in reset_plan(observed, naming):
            assert_ours(c.unit, naming, config)
            assert observed.get(c.unit) is not None

    # --- every rejected pod is named exactly once; one that is neither planned nor warned
    # about is a finished pod.
    if traced and items is not None:
        accounted = 0
        # A pod named "" is reported as 'ns/': those are counted as a group.
        unnamed = [i for i, item in enumerate(items) if _name_of(item) == ""]
        anonymous = [w for w in warnings if REJECTION.match(w) and w.startswith(("pod ns/: ", "pod default/: "))]
        assert len(anonymous) == len(unnamed), (unnamed, anonymous)
        accounted += len(anonymous)
        for i, item in enumerate(items):
            if i in unnamed:
                continue
            mine = [u for u in p.units if u.level == "pod" and (u.pod or "").endswith(f"/tok{i}z")]
            rejected = _rejections_of(warnings, i)
            accounted += len(rejected)
            assert len(mine) + len(rejected) <= 1, (i, [u.unit for u in mine], rejected)
            if not mine and not rejected:
                status = item.get("status") if isinstance(item, dict) else None
                assert isinstance(status, dict) and status.get("phase") in DONE, \
                    f"item {i} vanished without a warning: {item!r:.300}"
        assert accounted == sum(1 for w in warnings if REJECTION.match(w) and " container " not in w.split(":")[0]), \
            warnings
        for w in warnings:
            assert w.isprintable(), repr(w)
    for w in warnings:  # test_warnings_are_one_line_whatever_the_name, ..._bounded_whatever_the_uid
        assert "\n" not in w and "\r" not in w, repr(w[:200])
        if len(w) >= 1000 and re.search(r"\.(memory|cpu): .* is (not a quantity|negative); pod skipped$", w, re.S):
            KNOWN["long quantity warning"] += 1  # test_quantity_warnings_are_bounded
            continue
        assert len(w) < 1000, repr(w[:200])
    return Outcome("done", len(pods), len(p.units), 0, len(warnings))


FOREIGN_UNITS = ["-.slice", "system.slice", "user.slice", "init.scope", "kubelet.service", "dbus.socket",
                 "kubepods.slice.d", "kubepods-burstable-pod../...slice",
                 "kubepods-besteffort-pod" + "g" * 32 + ".slice",
                 "cri-containerd-" + "A" * 64 + ".scope", "crio-" + "0" * 63 + ".scope",
                 "docker-" + "0" * 64 + ".service", "kubepods-burstable.slice/x", "", "kubepods-pod.slice",
                 "kube.slice", "system-foo.slice", "cri-containerd-" + HEX + ".scope\n"]
u64 = st.one_of(st.just(0), st.just(INFINITY), st.integers(0, UINT64_MAX), st.sampled_from([1, 4096, 2**63]))
held_props = st.one_of(st.none(), st.fixed_dictionaries(
    {}, optional={"MemoryMin": u64, "MemoryLow": u64, "MemoryHigh": st.integers(1, UINT64_MAX)}))


def observed_states(data, p_units: list[str], naming: Naming) -> dict:
    """What systemd might hold: some of the planned units, ours that are not planned
    (orphans), and units that are not ours at all."""
    observed = {}
    for name in p_units:
        if data.draw(st.integers(0, 2)):
            observed[name] = data.draw(held_props)
    for _ in range(data.draw(st.integers(0, 4))):
        kind = data.draw(st.sampled_from(["pod", "scope", "foreign", "text"]))
        if kind == "pod":
            name = naming.pod_slice(data.draw(st.sampled_from(["Guaranteed", "Burstable", "BestEffort"])),
                                    str(data.draw(st.uuids())))
        elif kind == "scope":
            name = container_scope(data.draw(valid_cids))
        elif kind == "foreign":
            name = data.draw(st.sampled_from(FOREIGN_UNITS))
        else:
            name = data.draw(st.text(max_size=30))
        observed[name] = data.draw(held_props)
    return observed


def run_case(doc, items, config, node, data, traced=True) -> Outcome:
    """check_pipeline with a populated observed state drawn from `data`."""
    try:
        pods, _ = parse_pods(doc)
        planned = [u.unit for u in plan(pods, node, config).units]
    except (PodsError, PlanError):
        planned = []
    observed = observed_states(data, planned, Naming.for_config(config))
    return check_pipeline(doc, items, config, node, observed, traced)


SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ------------------------------------------------------------------ properties

@SETTINGS
@given(case=pod_documents(), config=configs, node=nodes, data=st.data())
def test_hostile_pod_documents_name_only_our_units(case, config, node, data):
    doc, items = case
    run_case(doc, items, config, node, data)


@SETTINGS
@given(case=pod_documents(hostile_names=True), config=configs, node=nodes, data=st.data())
def test_hostile_names_and_namespaces(case, config, node, data):
    """Names and namespaces with newlines, NUL, unicode, 10,000 characters: same promises
    (which item a warning is about cannot be traced here, so that part is left to the test above)."""
    doc, items = case
    run_case(doc, items, config, node, data, traced=False)


@SETTINGS
@given(items=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=12), config=configs)
def test_duplicate_uids_keep_the_first_and_warn_once_per_copy(items, config):
    uids = {"a": BASE_UID, "b": "8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e", "c": "f" * 32}
    docs = [{"metadata": {"name": f"tok{i}z", "namespace": "ns", "uid": uids[k]},
             "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]},
             "status": {"phase": "Running", "containerStatuses": [
                 {"name": "c", "containerID": f"containerd://{i:064x}", "state": {"running": {}}}]}}
            for i, k in enumerate(items)]
    outcome = check_pipeline({"kind": "PodList", "items": docs}, docs, config, NodeFacts(64 * Gi))
    assert outcome.pods == len(set(items))
    pods, warnings = parse_pods(docs)
    assert len(warnings) == len(items) - len(set(items))
    assert all("appears twice" in w for w in warnings)


NAME_PARTS = ["kubepods", "burstable", "besteffort", "pod", BASE_UID.replace("-", "_"), BASE_UID, "-", "_",
              ".slice", ".scope", ".service", "cri-containerd", "crio", "docker", HEX, "..", "/", "\n",
              "foo", "bar", "system", "-.slice", "\x00", "\u00fc", "A"]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(NAME_PARTS), max_size=8), config=configs)
def test_parse_unit_accepts_only_names_of_ours(parts, config):
    """UnitNew/ListUnitsByPatterns names decide what the daemon refreshes and resets: a name
    parse_unit accepts must be one of ours."""
    naming = Naming.for_config(config)
    for name in ("".join(parts), "-".join(parts)):
        if naming.parse_unit(name) is not None:
            assert_ours(name, naming, config)


# ------------------------------------------------------------------ configs

CONFIG_KEYS = ["memoryReservationPolicy", "memoryThrottlingFactor", "hierarchy", "cgroupRoot", "kubeReserved",
               "systemReserved", "evictionHard", "enforceNodeAllocatable", "kubeReservedCgroup",
               "systemReservedCgroup", "protectionHeadroom", "podsFile", "kubelet", "kubeletConfigFile",
               "metrics", "resyncInterval"]
CGROUPS = ["/", "/../..", "/.", "/..", "/a/../b", "/-", "/-.slice", "/foo.slice/foo-bar.slice", "/foo.slice/bar.slice",
           "/a-b", "/a_b", "/a:b", "/\u00fc", "/a b", "/a\nb", "//", "/kubepods", "/kubepods.slice", "/system.slice",
           "/a.slice/a-.slice", "/a\\x2d.slice", "/...", "/.slice", "/..slice", "/a-.slice", "/a--b.slice",
           "/-a.slice", "/kubepods-burstable.slice", "/kubepods-besteffort.slice", "/kubepods-pod.slice",
           "/system.slice/../x.slice", "/a\\b.slice", "/a.slice/", "/user.slice", "/init.scope",
           "/sys-fs-fuse-connections.mount", "/a.slice\n", "/kube.slice", "/a.slice/a-b.slice", "relative.slice",
           "/" + "a" * 300 + ".slice", "/*.slice", "/kubepods-*.slice", "/a.slice\x00"]
config_values = {
    "memoryReservationPolicy": st.sampled_from([*POLICIES, "none", "", "Tiered"]),
    "memoryThrottlingFactor": st.one_of(st.floats(), st.sampled_from([0, 1, 0.9, -0.1, 1.0000001, None, True])),
    "hierarchy": st.sampled_from([*HIERARCHIES, "Effective", ""]),
    "cgroupRoot": st.one_of(st.sampled_from(CGROUPS), hostile_text.map(lambda t: "/" + t)),
    "kubeReserved": st.dictionaries(st.sampled_from(["memory", "cpu", "pid", "memroy"]), quantities, max_size=3),
    "systemReserved": st.dictionaries(st.sampled_from(["memory", "cpu", "ephemeral-storage"]), quantities, max_size=3),
    "evictionHard": st.dictionaries(st.sampled_from(["memory.available", "nodefs.available", "memory"]),
                                    st.one_of(quantities, st.sampled_from(["5%", "100%", "-1%", "99.9%", "1e2%", "%"])),
                                    max_size=2),
    "enforceNodeAllocatable": st.lists(st.sampled_from(["pods", "kube-reserved", "system-reserved", "none", "x"]),
                                       max_size=3),
    "kubeReservedCgroup": st.one_of(st.sampled_from(CGROUPS), hostile_text.map(lambda t: "/" + t + ".slice")),
    "systemReservedCgroup": st.one_of(st.sampled_from(CGROUPS), hostile_text.map(lambda t: "/" + t + ".slice")),
    "protectionHeadroom": st.one_of(quantities, st.sampled_from(["5%", "99.99%", "100%", "0%"])),
    "podsFile": st.one_of(st.sampled_from(["/etc/pods.yaml", "pods.yaml", "", "/"]), hostile_text),
    "kubelet": st.one_of(st.fixed_dictionaries({}, optional={
        "url": st.sampled_from(["https://127.0.0.1:10250/pods", "http://[::1]:10255/pods", "ftp://x", "http://",
                                "https://a b/pods", "http://user:pw@host/pods?token=x", "https://127.0.0.1:99999/"]),
        "tokenFile": st.sampled_from(["/t", "t", "", "/\n"]), "insecureSkipTLSVerify": st.one_of(st.booleans(), junk),
        "pollInterval": st.one_of(st.sampled_from(["5s", "0s", "1ms", "100h", "1m30s", "-1s", "5"]), st.floats()),
        "timeout": st.one_of(st.sampled_from(["5s", "301s", "0.1s"]), st.floats()),
        "caFile": hostile_text, "clientCertFile": st.just("/c"), "clientKeyFile": st.just("/k")}), junk),
    "kubeletConfigFile": st.one_of(st.sampled_from(["/etc/kubelet.yaml", "x"]), hostile_text),
    "metrics": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"listen": st.one_of(
        st.sampled_from(["127.0.0.1:9759", "0.0.0.0:1", ":9759", "[::1]:9759", "x:0", "x:65536", None, False, True]),
        hostile_text)}), junk),
    "resyncInterval": st.one_of(st.sampled_from(["60s", "0.5s", "1s", "86401s", "1h", "1d"]), st.floats(),
                                st.integers()),
}


@st.composite
def config_maps(draw):
    doc = {}
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=7, unique=True)):
        doc[key] = draw(st.one_of(config_values[key], config_values[key], config_values[key], junk))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(st.one_of(hostile_text, st.sampled_from(["MemoryReservationPolicy", "cgroup_root"])))] = draw(junk)
    if draw(st.integers(0, 19)) == 0:
        return draw(junk)
    return doc


PODS_FOR_CONFIGS = parse_pods([
    {"metadata": {"name": "g", "namespace": "ns", "uid": BASE_UID},
     "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi", "cpu": "1"},
                                                         "limits": {"memory": "1Gi", "cpu": "1"}}}]},
     "status": {"phase": "Running", "containerStatuses": [{"name": "c", "containerID": f"containerd://{HEX}",
                                                           "state": {"running": {}}}]}},
    {"metadata": {"name": "b", "namespace": "ns", "uid": "f" * 32},
     "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "256Mi"},
                                                         "limits": {"memory": "1Gi"}}}]},
     "status": {"phase": "Running"}},
])[0]


def check_config_error(e: ConfigError) -> None:
    """One line (test_config_errors_are_one_line), but for the open bug of unknown keys."""
    unknown_key = re.search(r"is not a known key( \(did you mean \w+\?\))?$", str(e))
    if unknown_key and ("\n" in str(e) or len(str(e)) >= 1000):
        KNOWN["unknown key printed raw"] += 1  # test_config_error_for_an_unknown_key_is_one_short_line
        return
    assert "\n" not in str(e) and len(str(e)) < 1000, str(e)[:300]


def check_config(doc) -> str:
    """parse_config -> Naming.for_config -> plan -> diff: ConfigError/NamingError/PlanError or our names only."""
    try:
        config = parse_config(doc, "fuzz.yaml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.yaml: "), str(e)
        check_config_error(e)
        return "config"
    try:
        naming = Naming.for_config(config)
    except NamingError:
        with pytest.raises(PlanError):
            plan(PODS_FOR_CONFIGS, NodeFacts(64 * Gi), config)
        return "naming"
    for name in (*naming.patterns(),):
        assert "\n" not in name and "/" not in name and name != "-.slice", name
    try:
        p = plan(PODS_FOR_CONFIGS, NodeFacts(64 * Gi), config)
    except PlanError as e:
        assert "\n" not in str(e)
        return "plan"
    for u in p.units:
        assert_ours(u.unit, naming, config)
        if u.level == "reserved":  # test_config_refuses_slice_names_systemd_refuses
            assert systemd_slice_name(u.unit), u.unit
        check_values(u.unit, u.properties())
    for c in diff(p, {}, naming):
        assert_ours(c.unit, naming, config)
        check_values(c.unit, c.props)
    return "ok"


def systemd_slice_name(name: str) -> bool:
    """slice_name_is_valid() in systemd's unit-name.c: `-.slice`, or dash-separated non-empty parts."""
    if name == "-.slice":
        return True
    stem = name[: -len(".slice")]
    return name.endswith(".slice") and all(stem.split("-"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=config_maps())
def test_hostile_configs(doc):
    check_config(doc)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(doc=config_maps())
def test_hostile_configs_through_the_yaml_file(tmp_path, doc):
    path = tmp_path / "config.yaml"
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        load_config(path, required=True)
    except ConfigError as e:
        check_config_error(e)


# ------------------------------------------------------------------ documents through the FileSource

def fetch_in_thread(source: FileSource):
    """FileSource.fetch as the daemon runs it (asyncio.to_thread): in a thread, with its stack."""
    result: list = []

    def target():
        try:
            result.append(("ok", source.fetch()))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            result.append(("error", e))

    t = threading.Thread(target=target)
    t.start()
    t.join(120)
    assert result, "fetch did not return"
    kind, value = result[0]
    if kind == "error":
        raise value
    return value


def _bulk_pod(i: int, pad: int) -> dict:
    return {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": str(uuid.UUID(int=i + 1)),
                         "annotations": {"pad": "x" * pad}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "64Mi"}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable", "containerStatuses": [
                {"name": "c", "containerID": f"containerd://{i:064x}", "state": {"running": {}}}]}}


def test_ten_mb_pod_list_through_the_file_source(tmp_path):
    """20,000 pods in just under 10 MiB (the cap and MAX_PODS both reached): read, planned, named."""
    items = [_bulk_pod(i, 90) for i in range(20_000)]
    text = json.dumps({"kind": "PodList", "items": items})
    assert MAX_RESPONSE_BYTES - 200_000 < len(text) <= MAX_RESPONSE_BYTES
    path = tmp_path / "pods.json"
    path.write_text(text)
    started = time.monotonic()
    snap = fetch_in_thread(FileSource(path))
    config = CONFIGS[2]
    p = plan(list(snap.pods), NodeFacts(1 << 40), config)
    naming = Naming.for_config(config)
    for u in p.units:
        assert_ours(u.unit, naming, config)
    assert len(snap.pods) == 20_000 and len(p.units) >= 40_000
    assert time.monotonic() - started < 30


def test_ten_mb_plus_one_byte_is_refused_unread(tmp_path):
    path = tmp_path / "pods.json"
    path.write_bytes(b" " * MAX_RESPONSE_BYTES + b"[]")
    started = time.monotonic()
    with pytest.raises(SourceError) as e:
        FileSource(path).fetch()
    assert e.value.kind == "too_large" and time.monotonic() - started < 1


@pytest.mark.parametrize("make", [
    lambda: "[" * (MAX_RESPONSE_BYTES - 1),
    lambda: "{\"a\":" * (MAX_RESPONSE_BYTES // 5 - 1),
    lambda: "- " * (MAX_RESPONSE_BYTES // 2 - 1),
    lambda: "a:\n" + "".join(" " * d + "a:\n" for d in range(1, 3000)),
    lambda: "[" * 100_000 + "]" * 100_000,
], ids=["json-lists", "json-maps", "yaml-block-list", "yaml-indent", "balanced"])
def test_ten_mb_of_nesting_is_an_error_not_a_crash(tmp_path, make):
    path = tmp_path / "pods"
    path.write_text(make())
    started = time.monotonic()
    with pytest.raises(SourceError) as e:
        fetch_in_thread(FileSource(path))
    assert e.value.kind in ("decode", "pods", "too_large"), e.value
    assert time.monotonic() - started < 30


def test_ten_mb_uid_and_container_id(tmp_path):
    """One pod whose UID and container ID are 5 MB each (10 MB in all): not planned, nothing breaks."""
    item = _bulk_pod(0, 0)
    item["metadata"]["uid"] = "a" * ((5 << 20) - 8192)
    item["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "b" * ((5 << 20) - 8192)
    good = _bulk_pod(1, 0)
    item["metadata"]["name"], good["metadata"]["name"] = "tok0z", "tok1z"
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": [item, good]}))
    snap = FileSource(path).fetch()
    outcome = check_pipeline(json.loads(path.read_text()), [item, good], CONFIGS[0], NodeFacts(16 * Gi))
    assert outcome.pods == 2 and len(snap.pods) == 2


BOMB_TARGET = os.path.join(tempfile.gettempdir(), f"memqos-yaml-pwned-{os.getpid()}")
HOSTILE_YAML = [
    f"!!python/object/apply:os.system ['touch {BOMB_TARGET}']\n",
    f"items: [!!python/object/apply:os.system ['touch {BOMB_TARGET}']]\n",
    "!!python/object/new:subprocess.Popen [['true']]\n",
    "!!python/name:os.system\n",
    "!!python/module:os\n",
    "!!python/object:collections.OrderedDict {}\n",
    f"%TAG !p! tag:yaml.org,2002:python/object/apply:\n---\n!p!os.system ['touch {BOMB_TARGET}']\n",
    "kind: PodList\nitems: !!set {a, b}\n",
    "kind: PodList\nitems: !!binary aGVsbG8=\n",
    "kind: PodList\nitems: [!!binary aGVsbG8=]\n",
    "kind: PodList\nitems: !!omap [a: 1]\n",
    "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b]\n",
    "base: &b {kind: PodList}\n<<: *b\nitems: []\n",
    "? [a, b]\n: c\n",
    "? {a: b}\n: c\n",
    "kind: PodList\nitems:\n- metadata: {name: a, uid: !!int '12'}\n  spec: {containers: []}\n",
    "--- \nkind: PodList\n---\nkind: PodList\n",
    "%YAML 1.1\n---\nkind: PodList\nitems: []\n...\n",
    "%YAML 9.9\n---\n[]\n",
    "\ufeffkind: PodList\nitems: []\n",
    "kind: PodList\x00\nitems: []\n",
    "kind: PodList\r\nitems:\r\n\t- x\r\n",
    "kind: !custom PodList\n",
    "kind: PodList\nitems: [{metadata: {name: a, uid: " + BASE_UID + "},"
    " spec: {containers: [{name: c, resources: {requests: {memory: !!float .nan}}}]}}]\n",
    "kind: PodList\nitems: [{metadata: {name: a, uid: " + BASE_UID + "},"
    " spec: {containers: [{name: c, resources: {requests: {memory: .inf}}}]}}]\n",
    "kind: PodList\nitems: [{metadata: {name: 2001-12-14, uid: 2001-12-14t21:59:43.10-05:00}, spec: {}}]\n",
    "kind: PodList\nitems: [{metadata: {name: a, uid: 0x" + "f" * 4000 + "}, spec: {}}]\n",
    "kind: PodList\nitems: [{metadata: {name: [a], uid: {b: c}}, spec: []}]\n",
    "kind: PodList\nitems: [{metadata: {name: ~, uid: null}, spec: ~}]\n",
    "kind: PodList\nitems: [{metadata: {name: yes, uid: no, namespace: on}, spec: {}}]\n",
]
# PyYAML raises ValueError/AttributeError (not YAMLError) for these: see the xfail test below.
YAML_CONSTRUCTOR_CRASHES = [
    "kind: PodList\nitems: [{metadata: {name: a, uid: 2001-13-45}}]\n",
    "x: 2001-02-30\n",
    "x: 0000-01-01\n",
    "x: !!timestamp nope\n",
    "x: !!int nope\n",
    "x: !!float nope\n",
    "x: 0x_\n",
    "x: 1" + "0" * 5000 + "\n",
    "[" + "1" * 5000 + "]\n",
]


@pytest.mark.parametrize("text", HOSTILE_YAML, ids=range(len(HOSTILE_YAML)))
def test_hostile_yaml_in_the_pods_file(tmp_path, text):
    path = tmp_path / "pods.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        snap = fetch_in_thread(FileSource(path))
    except SourceError as e:
        assert str(e).startswith(f"file {path}: ") and "\n" not in str(e)
    else:
        for config in CONFIGS[:3]:
            p = plan(list(snap.pods), NodeFacts(16 * Gi), config)
            for u in p.units:
                assert_ours(u.unit, Naming.for_config(config), config)
    assert not os.path.exists(BOMB_TARGET), "a YAML tag ran a command"


def test_truncated_json_pods_file_is_always_an_error(tmp_path):
    """A JSON pods file cut at any byte (a writer that died) is refused, never read as fewer pods."""
    doc = {"kind": "PodList", "items": [_bulk_pod(i, 0) for i in range(2)]}
    path = tmp_path / "pods.json"
    for text, step in ((json.dumps(doc), 1), (json.dumps(doc, indent=2), 5)):
        for cut in range(1, len(text) - 1, step):
            path.write_text(text[:cut])
            with pytest.raises(SourceError):
                FileSource(path).fetch()


# ------------------------------------------------------------------ known bugs (strict xfail)

def _three_huge_pods() -> list:
    return [{"metadata": {"name": f"p{i}", "namespace": "ns", "uid": str(uuid.UUID(int=i + 1))},
             "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": str(2**63 - 1)}}}]},
             "status": {"phase": "Running", "qosClass": "Burstable"}} for i in range(3)]


def test_planned_values_fit_in_uint64():
    pods, _ = parse_pods(_three_huge_pods())
    for config in CONFIGS:
        p = plan(pods, NodeFacts(16 * Gi), config)
        for u in p.units:
            describe_call(u.unit, u.properties())


def test_warnings_are_one_line_whatever_the_name():
    evil = "x\nJan 01 00:00:00 node memqos-systemd[1]: all pods protected"
    docs = [{"metadata": {"name": evil, "namespace": "ns", "uid": "not-a-uid"}, "spec": {"containers": []}},
            {"metadata": {"name": "ok", "namespace": "ns", "uid": BASE_UID}, "spec": {"containers": []}},
            {"metadata": {"name": evil, "namespace": "ns", "uid": BASE_UID}, "spec": {"containers": []}}]
    pods, warnings = parse_pods(docs)
    warnings += list(plan(pods, NodeFacts(16 * Gi), CONFIGS[0]).warnings)
    assert len(warnings) == 2
    for w in warnings:
        assert "\n" not in w, w


def test_warnings_are_bounded_whatever_the_uid():
    item = _bulk_pod(0, 0)
    item["metadata"]["uid"] = "a" * (5 << 20)
    other = _bulk_pod(1, 0)
    other["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "b" * (5 << 20)
    pods, warnings = parse_pods([item, other])
    warnings += list(plan(pods, NodeFacts(16 * Gi), CONFIGS[0]).warnings)
    assert len(warnings) == 2
    for w in warnings:
        assert len(w) < 1000, len(w)


@pytest.mark.parametrize("text", YAML_CONSTRUCTOR_CRASHES, ids=range(len(YAML_CONSTRUCTOR_CRASHES)))
def test_yaml_constructor_errors_are_source_errors(tmp_path, text):
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    with pytest.raises(SourceError):
        FileSource(path).fetch()


@pytest.mark.parametrize("text", ["resyncInterval: 2001-13-45\n", "cgroupRoot: !!int nope\n",
                                  "kubeReserved: {memory: 1" + "0" * 5000 + "}\n"], ids=["date", "tag", "digits"])
def test_yaml_constructor_errors_are_config_errors(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path, required=True)


@pytest.mark.xfail(strict=True, reason="a YAML pods file cut at a line end is valid YAML with fewer pods or fewer "
                                       "fields, and it is trusted (a cut inside a line is refused: no final newline); "
                                       "the daemon keeps every pod whose slice still runs (intake.carry_over), but a "
                                       "cut that drops the last container's requests is a real gap: write pods files "
                                       "atomically, or use JSON")
def test_truncated_yaml_pods_file_is_never_read_as_another_pod_list(tmp_path):
    doc = {"kind": "PodList", "items": [_bulk_pod(i, 0) for i in range(3)]}
    text = yaml.safe_dump(doc)
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    full = sorted((p.key, p.request, p.containers) for p in FileSource(path).fetch().pods)
    different = []
    for cut in range(1, len(text) - 1):
        path.write_text(text[:cut])
        try:
            pods = sorted((p.key, p.request, p.containers) for p in FileSource(path).fetch().pods)
        except SourceError:
            continue
        if pods != full:
            different.append(cut)
    assert not different, f"{len(different)} of {len(text) - 2} cut points read as another pod list"


@pytest.mark.parametrize("cgroup", ["/a-.slice", "/a--b.slice", "/kube.slice/kube-.slice"])
def test_config_refuses_slice_names_systemd_refuses(cgroup):
    with pytest.raises(ConfigError):
        parse_config({"enforceNodeAllocatable": ["pods", "kube-reserved"], "kubeReservedCgroup": cgroup})


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError) as e:
        parse_config({"memoryReservationPolicy": ["\n"]})
    assert "\n" not in str(e.value), str(e.value)


def test_reserved_slice_names_have_no_backslash():
    with pytest.raises((ConfigError, NamingError)):
        Naming.for_config(parse_config({"enforceNodeAllocatable": ["pods", "kube-reserved"],
                                 "kubeReservedCgroup": "/a\\b.slice"}))


def test_quantity_warnings_are_bounded():
    item = _bulk_pod(0, 0)
    item["spec"]["containers"][0]["resources"]["requests"]["memory"] = "9" * 100_000
    _, warnings = parse_pods([item, _bulk_pod(1, 0)])
    assert len(warnings) == 1 and len(warnings[0]) < 1000, len(warnings[0])


@pytest.mark.parametrize("key", ["a\nb", "x" * 10_000])
def test_config_error_for_an_unknown_key_is_one_short_line(key):
    with pytest.raises(ConfigError) as e:
        parse_config({key: 1})
    assert "\n" not in str(e.value) and len(str(e.value)) < 1000, str(e.value)[:200]
