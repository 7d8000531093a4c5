"""Helpers for guest-side e2e scenarios (runs on the guest's python3 with python3-dbus-next).

Import it from a Python scenario (the driver puts this directory on PYTHONPATH):

    from memqos_e2e import *

or use the `e2e` command line wrapper from a shell scenario. See tests/e2e/README.md.

Everything here talks to the real systemd over D-Bus (through busctl) the way the kubelet and
containerd do with the systemd cgroup driver: transient units made with StartTransientUnit.
"""
import fcntl
import json
import os
import socket
import subprocess
import sys
import time

CGROUP_ROOT = "/sys/fs/cgroup"
UINT64_MAX = (1 << 64) - 1
KUBELET_UNIT = "kubelet.service"
KUBELET_ADDR = ("127.0.0.1", 10255)       # the read-only port: plain HTTP
KUBELET_TLS_ADDR = ("127.0.0.1", 10250)   # the authenticated port, as the shipped config asks it
KUBELET_DIR = "/var/lib/memqos-e2e-kubelet"  # on the root overlay: survives reboot()
PODS_FILE = os.path.join(KUBELET_DIR, "pods.json")
# What the stand-in's "API server" knows: token -> {user, allow} (TokenReview + RBAC). The
# cluster outlives a kubelet: not in KUBELET_DIR, which the driver empties between scenarios.
CLUSTER_DIR = "/var/lib/memqos-e2e-cluster"
TOKENS_FILE = os.path.join(CLUSTER_DIR, "tokens.json")
KUBELET_CERT_DIR = "/var/lib/kubelet/pki"     # where a kubeadm kubelet keeps kubelet.crt
KUBELET_TOKEN = "/etc/memqos-systemd/kubelet-token"  # the shipped config's tokenFile
SERVICE_ACCOUNT = "system:serviceaccount:memqos-system:memqos-systemd"
GUEST_DIR = os.path.dirname(os.path.abspath(__file__))
CTL_PORT = os.environ.get("MEMQOS_E2E_CTL", "/dev/virtio-ports/org.memqos.e2e.0")

__all__ = [
    "check", "check_eq", "wait_for", "skip", "log", "need_deb", "pause_memqos",
    "SystemdError", "start_transient_unit", "stop_unit", "unit_exists", "unit_property",
    "active_state", "set_unit_properties", "control_group", "cgroup_path", "read_memory",
    "read_cgroup_file", "unit_path", "ensure_qos_slices", "pod_slice_name", "create_pod_slice",
    "delete_pod_slice", "create_container_scope", "delete_container_scope", "new_pod_uid",
    "new_container_id", "make_pod", "write_pods", "start_pod", "stop_pod", "kubelet_start",
    "kubelet_stop", "kubelet_restart", "kubelet_get_pods", "kubelet_enable", "kubelet_disable",
    "host_request", "host_qmp", "hotplug_memory", "online_memory_blocks", "reboot",
    "boot_number", "UINT64_MAX", "PODS_FILE", "KUBELET_UNIT",
    "KUBELET_TLS_ADDR", "KUBELET_CERT_DIR", "KUBELET_TOKEN", "SERVICE_ACCOUNT", "cluster_token",
    "install_kubelet_token",
]


# --------------------------------------------------------------------------- checks

def log(*args):
    print(*args, file=sys.stderr, flush=True)


def check(ok, what):
    """Print a CHECK line (the driver collects them) and return ok."""
    what = " ".join(str(what).split())  # one line
    print(f"CHECK {'ok' if ok else 'fail'} {what}", flush=True)
    return bool(ok)


def check_eq(actual, expected, what):
    ok = actual == expected
    return check(ok, f"{what}: {actual!r}" + ("" if ok else f" != expected {expected!r}"))


def wait_for(predicate, timeout=30.0, interval=0.2):
    """Poll predicate() until it returns a truthy value or timeout; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def skip(reason):
    """End the scenario as skipped (exit code 77, SKIP line)."""
    print(f"SKIP {reason}", flush=True)
    sys.exit(77)


def need_deb():
    """Skip the scenario if the payload has no .deb; fail it if one did not install."""
    if not os.environ.get("MEMQOS_E2E_DEBS"):
        skip("no .deb in the payload (make deb puts it in build/deb/)")
    if os.environ.get("MEMQOS_E2E_DEB_INSTALLED") != "1":
        check(False, "the payload's .deb installed (see install.log in the results)")
        sys.exit(1)


def pause_memqos():
    """If memqos-systemd.service runs, stop it until this scenario exits (then start it again):
    for checks of systemd or the harness that must not race the daemon."""
    import atexit

    if subprocess.run(["systemctl", "is-active", "-q", "memqos-systemd.service"]).returncode:
        return
    subprocess.run(["systemctl", "stop", "memqos-systemd.service"], check=True)
    atexit.register(subprocess.run, ["systemctl", "start", "memqos-systemd.service"])


# --------------------------------------------------------------------------- D-Bus / systemd
# Two interchangeable transports. Python scenarios use dbus-next (one ~1.5 s import under TCG,
# then ~30 ms a call); the `e2e` command line uses busctl (no import, ~0.3 s a call), which suits
# shell scenarios that start a new process for every step. MEMQOS_E2E_DBUS=busctl|dbus-next
# overrides. Both take the same values: variants as (signature, value), structs as tuples/lists.

SD_DEST = "org.freedesktop.systemd1"
SD_PATH = "/org/freedesktop/systemd1"
SD_MANAGER = "org.freedesktop.systemd1.Manager"
BACKEND = os.environ.get("MEMQOS_E2E_DBUS", "dbus-next")


class SystemdError(RuntimeError):
    pass


def _type_end(sig, i):
    c = sig[i]
    if c == "a":
        return _type_end(sig, i + 1)
    if c in "({":
        close = ")" if c == "(" else "}"
        j = i + 1
        while sig[j] != close:
            j = _type_end(sig, j)
        return j + 1
    return i + 1


def _split_sig(sig):
    out, i = [], 0
    while i < len(sig):
        j = _type_end(sig, i)
        out.append(sig[i:j])
        i = j
    return out


def _busctl_args(t, value):
    """Flatten a value of D-Bus type t into busctl's argument syntax. Variants are (sig, value)."""
    c = t[0]
    if c == "a":
        out = [str(len(value))]
        for v in value:
            out += _busctl_args(t[1:], v)
        return out
    if c == "(":
        out = []
        for tt, v in zip(_split_sig(t[1:-1]), value):
            out += _busctl_args(tt, v)
        return out
    if c == "v":
        sig, v = value
        return [sig] + _busctl_args(sig, v)
    if c == "b":
        return ["true" if value else "false"]
    return [str(value)]


def _busctl(*args):
    p = subprocess.run(["busctl", "--system", "--json=short", "--", *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemdError(f"busctl {args[0]} {' '.join(args[2:5])}: {p.stderr.strip()}")
    return json.loads(p.stdout) if p.stdout.strip() else None


def _busctl_call(path, interface, member, signature, body, destination):
    args = []
    for t, v in zip(_split_sig(signature), body):
        args += _busctl_args(t, v)
    reply = _busctl("call", destination, path, interface, member, signature, *args)
    return reply["data"] if reply else []


def _to_dbus_next(t, value):
    from dbus_next import Variant

    c = t[0]
    if c == "a":
        return [_to_dbus_next(t[1:], v) for v in value]
    if c == "(":
        return [_to_dbus_next(tt, v) for tt, v in zip(_split_sig(t[1:-1]), value)]
    if c == "v":
        sig, v = value
        return Variant(sig, _to_dbus_next(sig, v))
    return value


_dn = {"loop": None, "bus": None}


def _dbus_next_call(path, interface, member, signature, body, destination):
    import asyncio

    from dbus_next import BusType, Message, MessageType
    from dbus_next.aio import MessageBus

    async def go():
        if _dn["bus"] is None or not _dn["bus"].connected:
            _dn["bus"] = await MessageBus(bus_type=BusType.SYSTEM).connect()
        return await _dn["bus"].call(Message(
            destination=destination, path=path, interface=interface, member=member,
            signature=signature,
            body=[_to_dbus_next(t, v) for t, v in zip(_split_sig(signature), body)]))

    if _dn["loop"] is None:
        _dn["loop"] = asyncio.new_event_loop()
    reply = _dn["loop"].run_until_complete(go())
    if reply.message_type == MessageType.ERROR:
        raise SystemdError(f"{member}: {reply.error_name}: {reply.body[0] if reply.body else ''}")
    return reply.body


def _call(path, interface, member, signature="", body=(), destination=SD_DEST):
    global BACKEND
    if BACKEND == "dbus-next":
        try:
            return _dbus_next_call(path, interface, member, signature, body, destination)
        except ImportError:
            BACKEND = "busctl"
    return _busctl_call(path, interface, member, signature, body, destination)


def unit_path(name):
    """The unit's D-Bus object path (systemd loads the unit when the path is used)."""
    out = []
    for i, ch in enumerate(name):
        if ch.isascii() and (ch.isalpha() or (ch.isdigit() and i > 0)):
            out.append(ch)
        else:
            out.append("_%02x" % ord(ch))
    return "/org/freedesktop/systemd1/unit/" + "".join(out)


# Signatures of the unit properties the helpers accept as keyword arguments.
_PROP_SIGS = {
    "Description": "s", "Slice": "s", "Delegate": "b", "DefaultDependencies": "b",
    "MemoryAccounting": "b", "CPUAccounting": "b", "IOAccounting": "b", "TasksAccounting": "b",
    "MemoryMin": "t", "MemoryLow": "t", "MemoryHigh": "t", "MemoryMax": "t",
    "MemorySwapMax": "t", "CPUWeight": "t", "CPUQuotaPerSecUSec": "t", "TasksMax": "t",
    "PIDs": "au", "Wants": "as", "After": "as", "Before": "as", "RemainAfterExit": "b",
    "CollectMode": "s", "Type": "s",
}


def _props(props):
    """dict name -> value (signature from _PROP_SIGS) or name -> (sig, value)."""
    out = []
    for name, value in props.items():
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            sig, value = value
        else:
            sig = _PROP_SIGS.get(name)
            if sig is None:
                raise ValueError(f"unknown property {name}: pass (signature, value)")
        out.append((name, (sig, value)))
    return out


def _unit_iface(name):
    kind = name.rsplit(".", 1)[-1]
    return "org.freedesktop.systemd1." + kind.capitalize()


def unit_property(name, prop, interface=None):
    """Read a property of a unit (loads the unit if needed). interface defaults by suffix for
    type-specific properties; common ones (ActiveState, ...) use org.freedesktop.systemd1.Unit."""
    iface = interface or _unit_iface(name)
    if BACKEND == "busctl":
        return _busctl("get-property", SD_DEST, unit_path(name), iface, prop)["data"]
    (v,) = _call(unit_path(name), "org.freedesktop.DBus.Properties", "Get", "ss", [iface, prop])
    if isinstance(v, dict):  # busctl's JSON for a variant (dbus-next was not importable)
        return v.get("data")
    return v.value if hasattr(v, "value") else v


def active_state(name):
    return unit_property(name, "ActiveState", "org.freedesktop.systemd1.Unit")


def unit_exists(name):
    """True if the unit is loaded and not inactive/failed (i.e. running)."""
    return active_state(name) in ("active", "activating", "reloading")


def start_transient_unit(name, props, wait=True, timeout=30.0):
    """StartTransientUnit(name, "fail", props, []) and wait until it is active."""
    _call(SD_PATH, SD_MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
          [name, "fail", _props(props), []])
    if wait and not wait_for(lambda: active_state(name) == "active", timeout, 0.1):
        raise SystemdError(f"{name} did not become active: {active_state(name)}")
    return name


def stop_unit(name, wait=True, timeout=30.0):
    """StopUnit(name, "replace"); wait until it is inactive (transient units then go away)."""
    try:
        _call(SD_PATH, SD_MANAGER, "StopUnit", "ss", [name, "replace"])
    except SystemdError as e:
        if "not loaded" in str(e) or "NoSuchUnit" in str(e):
            return
        raise
    if wait:
        wait_for(lambda: active_state(name) in ("inactive", "failed"), timeout, 0.1)


def set_unit_properties(name, runtime=True, **props):
    """SetUnitProperties(name, runtime, props), e.g. set_unit_properties("kubepods.slice",
    MemoryMin=100 << 20). Values are bytes (type t); UINT64_MAX means infinity."""
    _call(SD_PATH, SD_MANAGER, "SetUnitProperties", "sba(sv)", [name, runtime, _props(props)])


def control_group(name):
    """The unit's ControlGroup property, e.g. '/kubepods.slice/kubepods-burstable.slice/...'."""
    return unit_property(name, "ControlGroup")


def cgroup_path(name):
    cg = control_group(name)
    if not cg:
        raise SystemdError(f"{name} has no control group (is it running?)")
    return CGROUP_ROOT + cg


def read_cgroup_file(name, filename):
    with open(os.path.join(cgroup_path(name), filename)) as f:
        return f.read().strip()


def _num(text):
    return UINT64_MAX if text == "max" else int(text)


def read_memory(name):
    """{'min': int, 'low': int, 'high': int} from the unit's cgroup; 'max' reads as UINT64_MAX."""
    base = cgroup_path(name)
    out = {}
    for key in ("min", "low", "high", "max"):
        with open(os.path.join(base, "memory." + key)) as f:
            out[key] = _num(f.read().strip())
    return out


# --------------------------------------------------------------------------- kube-like units

_QOS = {"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"}


def _qos_key(qos):
    key = qos.lower().replace("-", "").replace("_", "")
    if key not in _QOS:
        raise ValueError(f"qos must be Guaranteed, Burstable or BestEffort, not {qos!r}")
    return key


def new_pod_uid():
    import uuid  # imported late: every import costs under TCG

    return str(uuid.uuid4())


def new_container_id():
    return os.urandom(32).hex()


def pod_slice_name(uid, qos="burstable"):
    """kubepods-burstable-pod<uid with _>.slice (Guaranteed pods: kubepods-pod<uid>.slice)."""
    tier = _QOS[_qos_key(qos)]
    escaped = uid.replace("-", "_")
    return f"kubepods-{tier}-pod{escaped}.slice" if tier else f"kubepods-pod{escaped}.slice"


def _parent_slice(slice_name):
    stem = slice_name[: -len(".slice")]
    return stem.rsplit("-", 1)[0] + ".slice" if "-" in stem else "-.slice"


_ACCOUNTING = {"MemoryAccounting": True, "CPUAccounting": True, "IOAccounting": True,
               "TasksAccounting": True}


def ensure_qos_slices():
    """Create kubepods.slice, kubepods-burstable.slice, kubepods-besteffort.slice as the kubelet
    does at start-up (transient slices), unless they are already running."""
    for name in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"):
        if unit_exists(name):
            continue
        try:
            start_transient_unit(name, dict(
                Description=f"libcontainer container {name[:-6]}",
                Wants=[_parent_slice(name)], DefaultDependencies=False, **_ACCOUNTING))
        except SystemdError as e:
            if "already exists" not in str(e) and "UnitExists" not in str(e):
                raise


def create_pod_slice(uid, qos="burstable", **props):
    """Create the pod's slice like the kubelet (systemd cgroup driver). Extra props, e.g.
    MemoryMax=..., are passed on. Returns the slice name."""
    ensure_qos_slices()
    name = pod_slice_name(uid, qos)
    all_props = dict(Description=f"libcontainer container {name[:-6]}",
                     Wants=[_parent_slice(name)], DefaultDependencies=False, **_ACCOUNTING)
    all_props.update(props)
    return start_transient_unit(name, all_props)


def delete_pod_slice(uid_or_slice, qos="burstable"):
    name = uid_or_slice if uid_or_slice.endswith(".slice") else pod_slice_name(uid_or_slice, qos)
    stop_unit(name)


def create_container_scope(pod_slice, container_id=None, command=("sleep", "infinity"), **props):
    """Start `command` and put it in cri-containerd-<64hex>.scope with Slice=pod_slice, the way
    runc does for containerd. Returns (scope_name, pid)."""
    container_id = container_id or new_container_id()
    name = f"cri-containerd-{container_id}.scope"
    proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    all_props = dict(Description=f"libcontainer container {container_id}", Slice=pod_slice,
                     Delegate=True, PIDs=[proc.pid], DefaultDependencies=False, **_ACCOUNTING)
    all_props.update(props)
    try:
        start_transient_unit(name, all_props)
    except Exception:
        proc.kill()
        raise
    return name, proc.pid


def delete_container_scope(scope_or_id):
    name = scope_or_id if scope_or_id.endswith(".scope") else f"cri-containerd-{scope_or_id}.scope"
    stop_unit(name)


# --------------------------------------------------------------------------- pods for the kubelet

def _qty_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    q = str(q)
    for suffix in sorted(units, key=len, reverse=True):
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * units[suffix])
    return int(q)


def _derive_qos(containers):
    reqs = [c.get("requests", {}) for c in containers]
    lims = [c.get("limits", {}) for c in containers]
    if not any(reqs) and not any(lims):
        return "BestEffort"
    guaranteed = all(
        all(r in lim for r in ("cpu", "memory"))
        and all(req.get(r, lim[r]) == lim[r] for r in ("cpu", "memory"))
        for req, lim in zip(reqs, lims)
    )
    return "Guaranteed" if guaranteed else "Burstable"


def make_pod(name, containers=None, namespace="default", uid=None, qos=None, phase="Running",
             annotations=None, labels=None, node="memqos-e2e"):
    """A v1 Pod as the kubelet's /pods returns it. containers: list of dicts with 'name' and
    optional 'requests'/'limits' ({'memory': '100Mi', 'cpu': '100m'}) and 'id' (64 hex; made up
    if absent). qos (Guaranteed/Burstable/BestEffort) is derived from resources if not given."""
    containers = [dict(c) for c in (containers or [{"name": "main"}])]
    for c in containers:
        c.setdefault("id", new_container_id())
    uid = uid or new_pod_uid()
    qos = qos or _derive_qos(containers)
    spec_containers = []
    statuses = []
    for c in containers:
        res = {}
        if c.get("requests"):
            res["requests"] = dict(c["requests"])
        if c.get("limits"):
            res["limits"] = dict(c["limits"])
        spec_containers.append({"name": c["name"], "image": c.get("image", "busybox:latest"),
                                "resources": res})
        statuses.append({"name": c["name"], "containerID": f"containerd://{c['id']}",
                         "ready": phase == "Running", "restartCount": 0,
                         "image": c.get("image", "busybox:latest"),
                         "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
                         if phase == "Running" else {"waiting": {"reason": "ContainerCreating"}}})
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "annotations": dict(annotations or {}), "labels": dict(labels or {}),
                     "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"nodeName": node, "containers": spec_containers},
        "status": {"phase": phase, "qosClass": qos, "containerStatuses": statuses},
    }


def write_pods(pods, path=PODS_FILE):
    """Atomically replace what the stand-in kubelet serves on /pods (a v1 PodList)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def start_pod(pod):
    """Create the pod slice and one container scope per containerStatus of a make_pod() pod.
    Returns {'slice': name, 'scopes': [names], 'pids': [pids]}."""
    uid = pod["metadata"]["uid"]
    qos = pod["status"]["qosClass"]
    slice_name = create_pod_slice(uid, qos)
    scopes, pids = [], []
    for st in pod["status"].get("containerStatuses", []):
        cid = st["containerID"].split("://", 1)[-1]
        scope, pid = create_container_scope(slice_name, cid)
        scopes.append(scope)
        pids.append(pid)
    return {"slice": slice_name, "scopes": scopes, "pids": pids}


def stop_pod(pod):
    for st in pod["status"].get("containerStatuses", []):
        delete_container_scope(st["containerID"].split("://", 1)[-1])
    delete_pod_slice(pod["metadata"]["uid"], pod["status"]["qosClass"])


def _port_open(addr=KUBELET_ADDR):
    try:
        with socket.create_connection(addr, timeout=1):
            return True
    except OSError:
        return False


# The stand-in is a regular unit named kubelet.service, as on a real node: a runtime unit in
# /run/systemd/system for kubelet_start() (gone at reboot), or an enabled one in /etc for
# kubelet_enable(). Not a transient unit (systemd-run): the daemon's unit has
# Before=kubelet.service, which keeps kubelet.service loaded for good, and systemd remembers a
# loaded unit as transient across daemon-reload and deletes its unit file when it is freed at
# shutdown -- even a file later written to /etc (seen in the guest: an enabled kubelet.service
# lost across reboot()).
_RUNTIME_UNIT = "/run/systemd/system/" + KUBELET_UNIT
_PERSISTENT_UNIT = "/etc/systemd/system/" + KUBELET_UNIT
_PERSISTENT_STUB = "/usr/local/lib/memqos-e2e/kubelet_stub.py"


def _kubelet_unit_text(stub, note):
    return f"""[Unit]
Description=kubelet stand-in (memqos e2e, {note})

[Service]
ExecStart=/usr/bin/python3 {stub} --pods-file {PODS_FILE} --address {KUBELET_ADDR[0]} --port {KUBELET_ADDR[1]} \\
  --tls-port {KUBELET_TLS_ADDR[1]} --cert-dir {KUBELET_CERT_DIR} --tokens {TOKENS_FILE}
KillMode=mixed

[Install]
WantedBy=multi-user.target
"""


def _write_unit(path, text):
    """Write a unit file; True if it changed (a daemon-reload is needed)."""
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return True


def _listening():
    """Both of the stand-in's ports answer (the TLS one after it made its certificate)."""
    return _port_open(KUBELET_ADDR) and _port_open(KUBELET_TLS_ADDR)


def cluster_token(user=SERVICE_ACCOUNT, allow=("pods",)):
    """The token the cluster holds for `user` (what `kubectl -n memqos-system get secret
    memqos-systemd-token -o jsonpath='{.data.token}' | base64 -d` prints on a real cluster),
    made on first use; `allow` is what RBAC lets it get on nodes/* (the stand-in asks this file
    on every request, as the kubelet asks the API server)."""
    try:
        with open(TOKENS_FILE) as f:
            tokens = json.load(f)
    except (OSError, ValueError):
        tokens = {}
    token = next((t for t, who in tokens.items() if who.get("user") == user), None) or \
        f"e2e.{os.urandom(24).hex()}"
    tokens[token] = {"user": user, "allow": list(allow)}
    os.makedirs(CLUSTER_DIR, exist_ok=True)
    with open(TOKENS_FILE + ".tmp", "w") as f:
        json.dump(tokens, f)
    os.replace(TOKENS_FILE + ".tmp", TOKENS_FILE)
    return token


def install_kubelet_token(token=None, path=KUBELET_TOKEN):
    """README's token step on the node: `... | install -m 0600 /dev/stdin <path>` (there through
    ssh from a machine with kubectl). `token` defaults to the ServiceAccount's, cluster_token()."""
    token = cluster_token() if token is None else token
    subprocess.run(["install", "-m", "0600", "/dev/stdin", path], input=token.encode(), check=True)
    return token


def _ensure_kubelet_token():
    """A node set up as README says has the ServiceAccount's token in place: put it there when
    the package is installed and it is missing or another one (a scenario that tests without it
    changes it afterwards, and one that stopped halfway does not leak into the next)."""
    if not os.path.isdir(os.path.dirname(KUBELET_TOKEN)):
        return
    token = cluster_token()
    try:
        with open(KUBELET_TOKEN) as f:
            if f.read().strip() == token:
                return
    except OSError:
        pass
    install_kubelet_token(token)


def _ensure_pods_file(pods):
    if pods is not None:
        write_pods(pods)
    elif not os.path.exists(PODS_FILE):
        write_pods([])


def kubelet_start(pods=None, timeout=30.0):
    """Run the /pods stand-in on 127.0.0.1:10255 (read-only) and 127.0.0.1:10250 (TLS, tokens)
    as kubelet.service. If pods is given, write it first; otherwise keep (or create an empty)
    pods file. Puts the ServiceAccount's token where the shipped config reads it if missing."""
    _ensure_pods_file(pods)
    _ensure_kubelet_token()
    if unit_exists(KUBELET_UNIT):
        return
    if not os.path.exists(_PERSISTENT_UNIT):  # else the enabled one (kubelet_enable) is used
        if _write_unit(_RUNTIME_UNIT, _kubelet_unit_text(
                os.path.join(GUEST_DIR, "kubelet_stub.py"), "runtime")):
            subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "reset-failed", KUBELET_UNIT], stderr=subprocess.DEVNULL)
    p = subprocess.run(["systemctl", "start", KUBELET_UNIT], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemdError(f"systemctl start {KUBELET_UNIT}: {p.stderr.strip()}")
    if not wait_for(_listening, timeout):
        raise SystemdError("kubelet stand-in did not start listening")


def kubelet_enable(pods=None):
    """Install the stand-in as an enabled kubelet.service (unit file in /etc, stub copied out
    of the payload) so it also starts at boot, e.g. across reboot(); and start it now."""
    _ensure_pods_file(pods)
    _ensure_kubelet_token()
    os.makedirs(os.path.dirname(_PERSISTENT_STUB), exist_ok=True)
    with open(os.path.join(GUEST_DIR, "kubelet_stub.py")) as src, \
            open(_PERSISTENT_STUB, "w") as dst:
        dst.write(src.read())
    if unit_exists(KUBELET_UNIT):
        stop_unit(KUBELET_UNIT)
    if os.path.exists(_RUNTIME_UNIT):
        os.unlink(_RUNTIME_UNIT)
    _write_unit(_PERSISTENT_UNIT, _kubelet_unit_text(_PERSISTENT_STUB, "enabled"))
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    p = subprocess.run(["systemctl", "enable", "--now", KUBELET_UNIT], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemdError(f"systemctl enable --now {KUBELET_UNIT}: {p.stderr.strip()}")
    if not wait_for(_listening, 30):
        raise SystemdError("enabled kubelet stand-in did not start listening")


def kubelet_disable():
    """Undo kubelet_enable(): stop, disable and remove the unit file."""
    subprocess.run(["systemctl", "disable", "--now", KUBELET_UNIT], stderr=subprocess.DEVNULL)
    for path in (_PERSISTENT_UNIT, _PERSISTENT_STUB):
        if os.path.exists(path):
            os.unlink(path)
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "reset-failed", KUBELET_UNIT], stderr=subprocess.DEVNULL)


def kubelet_stop():
    stop_unit(KUBELET_UNIT)
    subprocess.run(["systemctl", "reset-failed", KUBELET_UNIT], stderr=subprocess.DEVNULL)
    wait_for(lambda: not _port_open(), 10)


def kubelet_restart(down_seconds=0.0, timeout=30.0):
    """Restart the stand-in like a kubelet restart: `systemctl restart kubelet.service` (new
    MainPID, same pods file), or with down_seconds > 0: stop, stay down that long, start."""
    if down_seconds or not unit_exists(KUBELET_UNIT):
        kubelet_stop()
        time.sleep(down_seconds)
        kubelet_start(timeout=timeout)
        return
    subprocess.run(["systemctl", "restart", KUBELET_UNIT], check=True)
    if not wait_for(_listening, timeout):
        raise SystemdError("kubelet stand-in did not come back after restart")


def kubelet_get_pods():
    import urllib.request

    with urllib.request.urlopen(f"http://{KUBELET_ADDR[0]}:{KUBELET_ADDR[1]}/pods",
                                timeout=5) as r:
        return json.load(r)


# --------------------------------------------------------------------------- host requests

def host_request(op, timeout=60.0, **fields):
    """Ask the host runner for something over the virtio-serial control port and return its
    reply dict. Ops: 'qmp' (execute=..., arguments={...}), 'hotplug-memory' (size_mib=...)."""
    if not os.path.exists(CTL_PORT):
        raise RuntimeError(f"no control port {CTL_PORT} (run_vm started without it?)")
    req_id = os.urandom(4).hex()
    msg = json.dumps(dict(fields, op=op, id=req_id)) + "\n"
    fd = os.open(CTL_PORT, os.O_RDWR | os.O_NOCTTY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, msg.encode())
        buf = b""
        deadline = time.monotonic() + timeout
        import select

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"host did not answer {op}")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                time.sleep(0.05)
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                if reply.get("id") == req_id:
                    if not reply.get("ok"):
                        raise RuntimeError(f"host: {op} failed: {reply.get('error')}")
                    return reply
    finally:
        os.close(fd)


def host_qmp(execute, **arguments):
    """Run a QMP command on this VM's qemu and return its 'return' value."""
    return host_request("qmp", execute=execute, arguments=arguments)["return"]


def hotplug_memory(size_mib=512):
    """Hot-add a pc-dimm of size_mib (the VM needs free slots/maxmem; default 1G,slots=2,maxmem=2G).
    Debian leaves the new memory blocks offline: see online_memory_blocks()."""
    return host_request("hotplug-memory", size_mib=int(size_mib))


def reboot():
    """Reboot the guest and continue this scenario after it: the scenario runs again from the
    top with MEMQOS_E2E_BOOT incremented (1 on its first run), its earlier output kept, so it
    branches on boot_number(). Does not return."""
    results = os.environ["MEMQOS_E2E_RESULTS"]
    state = {"scenario": os.environ["MEMQOS_E2E_SCENARIO"], "boot": boot_number() + 1}
    tmp = os.path.join(results, ".resume.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(results, ".resume.json"))
    # The journal is volatile: keep this boot's, the driver saves only the last boot's.
    with open(os.path.join(results, f"journal-{state['scenario']}-boot{boot_number()}.txt"),
              "w") as f:
        subprocess.run(["journalctl", "-b", "--no-pager", "-o", "short-monotonic"], stdout=f,
                       stderr=subprocess.STDOUT)
    os.sync()
    print(f"rebooting (next: boot {state['boot']})", flush=True)
    subprocess.run(["systemctl", "reboot"], check=True)
    while True:
        time.sleep(60)


def boot_number():
    """1 on a scenario's first boot, 2 after its first reboot(), ..."""
    return int(os.environ.get("MEMQOS_E2E_BOOT", "1"))


def online_memory_blocks():
    """echo online > every offline /sys/devices/system/memory/memoryN/state; returns the count."""
    n = 0
    base = "/sys/devices/system/memory"
    for entry in sorted(os.listdir(base)):
        state = os.path.join(base, entry, "state")
        if entry.startswith("memory") and os.path.exists(state):
            with open(state) as f:
                if f.read().strip() != "offline":
                    continue
            with open(state, "w") as f:
                f.write("online")
            n += 1
    return n


# --------------------------------------------------------------------------- the daemon
# Helpers for the daemon scenarios (10-79): its config, reload, metrics, journal, `plan`, and the
# kernel's memory.* files of every unit a plan names. Appended; nothing above depends on them.

MEMQOS_UNIT = "memqos-systemd.service"
MEMQOS_CONFIG = "/etc/memqos-systemd/config.yaml"
METRICS_URL = "http://127.0.0.1:9759/metrics"
# The shipped config, saved by the first memqos_write_config() of a boot (a scenario killed by
# its timeout cannot restore it; the next one then still knows the original).
_CONFIG_BACKUP = "/var/lib/memqos-e2e/config.yaml.orig"
PAGE_SIZE = 4096

__all__ += [
    "MEMQOS_UNIT", "MEMQOS_CONFIG", "METRICS_URL", "PAGE_SIZE", "metrics", "metric",
    "mem_total_bytes", "service_show", "memqos_write_config", "memqos_restore_config",
    "memqos_reload", "memqos_plan", "plan_expected", "slice_cgroup_dir", "unit_cgroup_dir",
    "kernel_memory", "compare_kernel", "wait_kernel", "journal_cursor", "journal_since",
    "sample_pods", "sample_config", "start_reserved_slices", "unit_loaded", "fmt_bytes",
    "deb_path", "systemctl", "reset_reserved_slices",
]


def check_findings(text):
    """`memqos-systemd check`'s output as [(level, text)]: a finding is wrapped at 100 columns, its
    continuation lines indented under its text; joined here, whitespace runs as one space."""
    found = []
    for line in text.splitlines():
        if line.startswith(" ") and found:
            found[-1] = (found[-1][0], found[-1][1] + " " + " ".join(line.split()))
        elif line.strip():
            level, _, rest = line.partition(" ")
            found.append((level, " ".join(rest.split())))
    return found


__all__ += ["check_findings"]


def systemctl(*args, check=False):
    """Run systemctl; returns the CompletedProcess (text, stdout+stderr captured)."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=check)


def service_show(prop, unit=MEMQOS_UNIT):
    """`systemctl show -P prop unit` as a string."""
    return systemctl("show", "-P", prop, unit).stdout.strip()


def fmt_bytes(n):
    if n is None:
        return "absent"
    if n == UINT64_MAX:
        return "max"
    if n and n % (1 << 20) == 0:
        return f"{n >> 20}Mi"
    return str(n)


def metrics(url=METRICS_URL, timeout=5.0):
    """The daemon's /metrics as {name: [(labels dict, value)]} (Prometheus text format)."""
    import re
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        if m:
            labels = dict(label.findall(m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def metric(name, _metrics=None, **labels):
    """Sum of the samples of `name` whose labels include `labels` (0.0 if none; None if the
    endpoint does not answer)."""
    try:
        data = _metrics if _metrics is not None else metrics()
    except OSError:
        return None
    return sum(v for l, v in data.get(name, []) if all(l.get(k) == str(x) for k, x in labels.items()))


def mem_total_bytes():
    """MemTotal of /proc/meminfo in bytes (the capacity the daemon plans with)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal")


def _yaml_dump(doc):
    import yaml

    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=False)


def memqos_write_config(doc, path=MEMQOS_CONFIG):
    """Write the daemon's config (a dict, dumped as YAML, or a string), keeping the shipped file
    to put back with memqos_restore_config() (registered to run at exit). Does not reload."""
    import atexit

    os.makedirs(os.path.dirname(_CONFIG_BACKUP), exist_ok=True)
    if not os.path.exists(_CONFIG_BACKUP) and os.path.exists(path):
        with open(path) as src, open(_CONFIG_BACKUP + ".tmp", "w") as dst:
            dst.write(src.read())
        os.replace(_CONFIG_BACKUP + ".tmp", _CONFIG_BACKUP)
    if not _restore_registered:
        atexit.register(memqos_restore_config)
        _restore_registered.append(True)
    text = doc if isinstance(doc, str) else _yaml_dump(doc)
    with open(path + ".e2e-tmp", "w") as f:
        f.write(text)
    os.replace(path + ".e2e-tmp", path)
    return text


_restore_registered = []


def memqos_restore_config(path=MEMQOS_CONFIG, reload=True):
    """Put the shipped config back (if memqos_write_config changed it) and reload the service."""
    if not os.path.exists(_CONFIG_BACKUP):
        return False
    with open(_CONFIG_BACKUP) as f:
        orig = f.read()
    try:
        with open(path) as f:
            same = f.read() == orig
    except FileNotFoundError:
        same = not os.path.isdir(os.path.dirname(path))  # package removed: nothing to restore
    if not same:
        with open(path + ".e2e-tmp", "w") as f:
            f.write(orig)
        os.replace(path + ".e2e-tmp", path)
        if reload and systemctl("is-active", "-q", MEMQOS_UNIT).returncode == 0:
            memqos_reload()
    os.unlink(_CONFIG_BACKUP)
    return True


def memqos_reload(timeout=30.0):
    """`systemctl reload memqos-systemd` and wait until the daemon has processed the SIGHUP
    (memqos_config_reloads_total grows). Returns True if it did. systemd 252 has no
    Type=notify-reload, so `systemctl reload` itself returns as soon as kill -HUP has run."""
    def reloads():
        return metric("memqos_config_reloads_total")

    before = wait_for(lambda: reloads() is not None, timeout) and reloads()
    p = systemctl("reload", MEMQOS_UNIT)
    if p.returncode != 0:
        raise SystemdError(f"systemctl reload {MEMQOS_UNIT}: {p.stderr.strip()}")
    return bool(wait_for(lambda: (reloads() or 0) > (before or 0), timeout, 0.05))


def memqos_plan(pods_file=PODS_FILE, config=MEMQOS_CONFIG, node_memory=None,
                page_size=PAGE_SIZE):
    """`memqos-systemd plan --output json` for the same pods and config as the daemon, at this
    node's MemTotal (or node_memory) and page size."""
    cmd = ["memqos-systemd", "plan", "--pods", pods_file, "--config", config, "--node-memory",
           str(node_memory or mem_total_bytes()), "--page-size", str(page_size), "--output", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def plan_expected(plan_doc):
    """{unit: {'min', 'low', 'high'}} from a plan document; 'infinity' as UINT64_MAX (the kernel's
    'max', as read_memory/kernel_memory read it)."""
    out = {}
    for u in plan_doc["units"]:
        high = u["MemoryHigh"]
        out[u["unit"]] = {"min": u["MemoryMin"], "low": u["MemoryLow"],
                          "high": UINT64_MAX if high == "infinity" else high}
    return out


def slice_cgroup_dir(name):
    """The cgroup directory systemd gives a slice: a-b-c.slice -> /sys/fs/cgroup/a.slice/a-b.slice/
    a-b-c.slice (no D-Bus call, so it loads nothing)."""
    if name == "-.slice":
        return CGROUP_ROOT
    parts = name[: -len(".slice")].split("-")
    return os.path.join(CGROUP_ROOT, *("-".join(parts[: i + 1]) + ".slice"
                                       for i in range(len(parts))))


_cg_cache = {}


def unit_cgroup_dir(name):
    """Slices: computed; other units: their ControlGroup over D-Bus (cached)."""
    if name.endswith(".slice"):
        return slice_cgroup_dir(name)
    if name not in _cg_cache:
        _cg_cache[name] = cgroup_path(name)
    return _cg_cache[name]


def kernel_memory(units):
    """{unit: {'min','low','high'} from the kernel's files, or None if its cgroup is absent}."""
    out = {}
    for u in units:
        try:
            base = unit_cgroup_dir(u)
            vals = {}
            for key in ("min", "low", "high"):
                with open(os.path.join(base, "memory." + key)) as f:
                    vals[key] = _num(f.read().strip())
            out[u] = vals
        except (OSError, SystemdError):
            out[u] = None
    return out


def compare_kernel(expected, observed=None):
    """List of 'unit key kernel=X plan=Y' mismatches (empty: all equal)."""
    observed = observed if observed is not None else kernel_memory(expected)
    bad = []
    for unit, want in expected.items():
        have = observed.get(unit)
        if have is None:
            bad.append(f"{unit}: no cgroup")
            continue
        for k in ("min", "low", "high"):
            if have[k] != want[k]:
                bad.append(f"{unit} memory.{k} kernel={fmt_bytes(have[k])} plan={fmt_bytes(want[k])}")
    return bad


def wait_kernel(expected, timeout=20.0, interval=0.05):
    """Poll until every unit's memory.min/low/high equal `expected`; returns (mismatches,
    seconds waited)."""
    start = time.monotonic()
    bad = wait_for(lambda: not compare_kernel(expected), timeout, interval)
    return ([] if bad else compare_kernel(expected)), time.monotonic() - start


def journal_cursor():
    """A mark for journal_since(): now, on the monotonic clock the journal stamps entries with.
    (`journalctl -n 0 --show-cursor` gives a cursor after which the first entry of a unit is
    skipped, seen in the guest; a time is simpler.)"""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def journal_since(mark, unit=MEMQOS_UNIT, identifier=None):
    """Messages of `unit` (or of a syslog identifier) of this boot logged at or after `mark`
    (from journal_cursor(); None: the whole boot)."""
    cmd = ["journalctl", "--no-pager", "-b", "-o", "json", "--output-fields",
           "MESSAGE,__MONOTONIC_TIMESTAMP"]
    cmd += ["-t", identifier] if identifier else ["-u", unit]
    subprocess.run(["journalctl", "--sync"], capture_output=True)
    out = []
    for line in subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        msg = e.get("MESSAGE")
        if isinstance(msg, list):  # non-UTF-8 messages come as byte arrays
            msg = bytes(msg).decode("utf-8", "replace")
        if mark is None or int(e.get("__MONOTONIC_TIMESTAMP", 0)) >= mark * 1e6:
            out.append(msg or "")
    return out


def unit_loaded(name):
    """True if systemd has the unit in memory, in any state, without loading it (ListUnits by
    pattern never loads; a unit's object path would)."""
    p = systemctl("list-units", "--all", "--plain", "--no-legend", "--no-pager", name)
    return any(line.split()[0] == name for line in p.stdout.splitlines() if line.split())


def sample_pods():
    """A small kubelet-like node: a Guaranteed pod, a Burstable pod with a limited app container
    and an unlimited sidecar, and a BestEffort pod."""
    g = make_pod("db", [{"name": "postgres",
                         "requests": {"memory": "96Mi", "cpu": "100m"},
                         "limits": {"memory": "96Mi", "cpu": "100m"}}])
    b = make_pod("web", [{"name": "app", "requests": {"memory": "48Mi"},
                          "limits": {"memory": "160Mi"}},
                         {"name": "sidecar", "requests": {"memory": "16Mi"}}])
    be = make_pod("batch", [{"name": "job"}])
    return [g, b, be]


def sample_config(**overrides):
    """The config the daemon scenarios run with: kubelet stand-in polled every second, kube.slice
    and system.slice reserved and enforced."""
    doc = {
        "memoryReservationPolicy": "TieredReservation",
        "hierarchy": "effective",
        "kubeReserved": {"memory": "64Mi"},
        "systemReserved": {"memory": "96Mi"},
        "enforceNodeAllocatable": ["pods", "kube-reserved", "system-reserved"],
        "kubeReservedCgroup": "/kube.slice",
        "systemReservedCgroup": "/system.slice",
        "kubelet": {"url": "http://127.0.0.1:10255/pods", "pollInterval": "1s", "timeout": "2s"},
    }
    doc.update(overrides)
    return doc


def start_reserved_slices():
    """Something running in kube.slice (as the kubelet and containerd would be), so that slice
    has a cgroup; system.slice always has one. Stopped at exit."""
    import atexit

    unit = "memqos-e2e-kube-daemon.service"
    if systemctl("is-active", "-q", unit).returncode != 0:
        systemctl("reset-failed", unit)
        subprocess.run(["systemd-run", "--quiet", "--unit", unit, "--slice", "kube.slice",
                        "--property", "Type=exec", "sleep", "infinity"], check=True)
        atexit.register(systemctl, "stop", unit)
    if not _reserved_reset_registered:
        atexit.register(reset_reserved_slices)  # runs before the earlier-registered restore
        _reserved_reset_registered.append(True)
    return unit


_reserved_reset_registered = []


def reset_reserved_slices():
    """Put the shipped config back (reload), then kube.slice and system.slice back to MemoryMin=0,
    MemoryLow=0: the daemon leaves a slice alone once its config no longer names it reserved, so
    the protection of the sample config would otherwise stay for the rest of the boot."""
    memqos_restore_config()
    for name in ("kube.slice", "system.slice"):
        try:
            set_unit_properties(name, MemoryMin=0, MemoryLow=0)
        except SystemdError as e:
            log(f"reset {name}: {e}")


def deb_path():
    """The payload's .deb as the driver staged it in the guest (for reinstalling)."""
    import glob

    found = sorted(glob.glob("/var/cache/memqos-e2e-debs/memqos-systemd_*.deb"))
    return found[-1] if found else None


def fresh_node(timeout=30.0):
    """Start a daemon scenario from a node as the kubelet leaves it at start-up: the kubelet
    stand-in running with no pods, the daemon's plan empty, kubepods.slice and its QoS slices
    made by StartTransientUnit and no /run/systemd/system.control/kubepods* drop-in.

    Needed because the driver's cleanup between scenarios (stop kubelet.service and
    kubepods.slice, remove the control drop-ins, daemon-reload) races the running daemon: with
    the kubelet gone it keeps its last pod list and may make kubepods.slice again right after,
    as a plain slice whose control drop-in would then override later writes at every
    daemon-reload (see 11-systemd-facts and 45-stale-dropins). Returns what it had to undo."""
    import atexit
    import glob
    import shutil

    if not _quiet_registered:
        atexit.register(quiet_node)
        _quiet_registered.append(True)
    kubelet_start([])
    wait_for(lambda: metric("memqos_pods") == 0, timeout, 0.2)  # the daemon saw the empty list
    found = [p for p in glob.glob("/run/systemd/system.control/kubepods*")]
    stray = unit_loaded("kubepods.slice") and service_show("Transient", "kubepods.slice") != "yes"
    if found or stray:
        systemctl("stop", "kubepods.slice")
        for p in found:
            shutil.rmtree(p, ignore_errors=True)
        systemctl("daemon-reload")
    ensure_qos_slices()
    return found + (["kubepods.slice (not transient)"] if stray else [])


_quiet_registered = []


def quiet_node(timeout=20.0):
    """Leave the node so the driver's cleanup does not race the daemon (registered by
    fresh_node to run at exit): /pods empty, the pod slices stopped, and the daemon's plan
    empty. Otherwise, with the kubelet stopped and kubepods.slice stopped by the driver, the
    daemon re-creates kubepods.slice from its last pod list while systemd still has the stopped
    transient unit, and gets "Unit kubepods.slice not found." (45-stale-dropins, step 2)."""
    try:
        write_pods([])
        p = systemctl("list-units", "--all", "--plain", "--no-legend", "--no-pager",
                      "kubepods-*pod*.slice")
        for line in p.stdout.splitlines():
            if line.split():
                stop_unit(line.split()[0], wait=False)
        if systemctl("is-active", "-q", MEMQOS_UNIT).returncode == 0:
            wait_for(lambda: metric("memqos_pods") == 0, timeout, 0.2)
        # Once a transient kubepods.slice has stopped, systemd 252 cannot load that name again
        # until a daemon-reload: LoadState not-found, "Failed to open /run/systemd/transient/
        # kubepods.slice", and SetUnitProperties answers "Unit kubepods.slice not found."
        # (11-systemd-facts E). The driver reloads only when it removed a control drop-in, and
        # 80-harness-reboot sets kubepods.slice first thing.
        systemctl("stop", "kubepods.slice")
        if service_show("LoadState", "kubepods.slice") == "not-found":
            systemctl("daemon-reload")
    except Exception as e:  # best effort: the driver cleans up anyway
        log(f"quiet_node: {e}")


def pods_only_config(**overrides):
    """sample_config(**overrides) without the reserved cgroups: only the pods are enforced."""
    cfg = sample_config(**overrides)
    for k in ("kubeReservedCgroup", "systemReservedCgroup"):
        cfg.pop(k)
    cfg["enforceNodeAllocatable"] = ["pods"]
    return cfg


def start_empty_node(cfg, what):
    """Install `cfg`, reload the daemon (checked, as `what`), and start from fresh_node() with no
    pods listed. Returns what fresh_node had to undo."""
    memqos_write_config(cfg)
    kubelet_start([])
    check(memqos_reload(), what)
    undone = fresh_node()
    log(f"fresh node: undid {undone}")
    return undone


def start_sample_node(pods, reserved=False):
    """From fresh_node(), a kubelet listing `pods` and running each of them (and the reserved
    slices if `reserved`). Returns {pod name: what start_pod returned}."""
    undone = fresh_node()  # a kubelet just started: its QoS slices, no pods yet
    log(f"fresh node: undid {undone}")
    kubelet_start(pods)
    units = {p["metadata"]["name"]: start_pod(p) for p in pods}
    if reserved:
        start_reserved_slices()
    return units


__all__ += ["fresh_node", "quiet_node", "pods_only_config", "start_empty_node", "start_sample_node"]


# ---- small readers shared by the fact scenarios (11, 12) ------------------------------------------
def show(unit, *props):
    """`systemctl show -p ...` of a unit as a dict."""
    p = systemctl("show", unit, "-p", ",".join(props))
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def read_file(path):
    """A small file's text, stripped; "absent (<reason>)" when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"absent ({e.strerror})"


def listing(path, missing=None):
    """The sorted names in a directory; `missing` when there is no such directory."""
    return sorted(os.listdir(path)) if os.path.isdir(path) else missing


__all__ += ["show", "read_file", "listing"]


# ---- the real runtime: Debian's runc with --systemd-cgroup, as containerd drives it ----------------
# containerd with `SystemdCgroup = true` runs every container, the pod's sandbox (pause) included,
# with `runc --systemd-cgroup` and linux.cgroupsPath "<pod slice>:cri-containerd:<id>": runc then
# makes cri-containerd-<id>.scope in the pod slice (StartTransientUnit, Delegate=yes), sends what it
# can convert as unit properties (SetUnitProperties) and writes every setting to the cgroup's files
# too. The containers run busybox-static from one read-only rootfs.
RUNC = "/usr/sbin/runc"
RUNC_STATE = "/run/memqos-e2e-runc"  # runc --root
RUNC_DIR = "/run/memqos-e2e-bundles"
RUNC_ROOTFS = os.path.join(RUNC_DIR, "rootfs")
# A current kubelet (>= 1.28 on cgroup v2, swap off): the whole container is killed on OOM, no swap.
KUBELET_UNIFIED = {"memory.oom.group": "1", "memory.swap.max": "0"}


def _runc(*args, check=True, timeout=60, detach=False):
    """runc with our state dir and the systemd driver. A detached container keeps runc's stdio
    (terminal: false), so `run --detach` gets /dev/null and a log file instead of pipes, which
    would never see their end."""
    log_file = os.path.join(RUNC_DIR, "runc.log")
    os.makedirs(RUNC_DIR, exist_ok=True)
    cmd = [RUNC, "--root", RUNC_STATE, "--log", log_file, "--systemd-cgroup", *args]
    if detach:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
        with open(log_file) as f:
            p.stderr = f.read()[-300:]
        p.stdout = ""
    else:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"runc {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[:300]}")
    return p


def _runc_rootfs():
    if not os.path.exists(os.path.join(RUNC_ROOTFS, "bin", "busybox")):
        for d in ("bin", "proc", "dev", "sys", "tmp"):
            os.makedirs(os.path.join(RUNC_ROOTFS, d), exist_ok=True)
        import shutil
        shutil.copy2("/bin/busybox", os.path.join(RUNC_ROOTFS, "bin", "busybox"))
    return RUNC_ROOTFS


def runc_run(pod_slice, container_id=None, *, limit=None, swap=None, unified=None,
             args=("/bin/busybox", "sleep", "100000")):
    """Run a container as containerd would for a pod: detached, in cri-containerd-<id>.scope under
    `pod_slice`, with linux.resources.memory {limit, swap} and the `unified` map (cgroup v2 files,
    e.g. KUBELET_UNIFIED). Returns {'id', 'scope', 'bundle'} once `runc run -d` has returned, i.e.
    once runc has written every setting."""
    import atexit

    container_id = container_id or new_container_id()
    bundle = os.path.join(RUNC_DIR, container_id)
    os.makedirs(bundle, exist_ok=True)
    _runc("spec", "--bundle", bundle)
    with open(os.path.join(bundle, "config.json")) as f:
        spec = json.load(f)
    spec["process"]["terminal"] = False
    spec["process"]["args"] = list(args)
    spec["root"] = {"path": _runc_rootfs(), "readonly": True}
    spec["linux"]["cgroupsPath"] = f"{pod_slice}:cri-containerd:{container_id}"
    resources = spec["linux"].setdefault("resources", {})
    memory = {k: v for k, v in (("limit", limit), ("swap", swap)) if v is not None}
    if memory:
        resources["memory"] = memory
    if unified:
        resources["unified"] = dict(unified)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f)
    if not _runc_cleanup_registered:
        atexit.register(runc_delete_all)
        _runc_cleanup_registered.append(True)
    _runc("run", "--detach", "--bundle", bundle, container_id, detach=True)
    return {"id": container_id, "scope": f"cri-containerd-{container_id}.scope", "bundle": bundle}


_runc_cleanup_registered = []


def runc_update(container_id, *, limit=None, swap=None, unified=None):
    """`runc update --resources <json>` as containerd's shim sends the kubelet's
    UpdateContainerResources (a resize, the kubelet's resource resync): memory {limit, swap} and
    the `unified` map, which a current kubelet sends again (KUBELET_UNIFIED). runc 1.1 replaces
    the container's unified map with the request's (update.go), so an update without it, like
    `runc update --memory X`, loses memory.oom.group: systemd's re-apply of the scope sets 0 and
    runc no longer writes 1 after it."""
    resources = {"memory": {k: v for k, v in (("limit", limit), ("swap", swap)) if v is not None}}
    if unified:
        resources["unified"] = dict(unified)
    path = os.path.join(RUNC_DIR, f"update-{container_id}.json")
    with open(path, "w") as f:
        json.dump(resources, f)
    _runc("update", "--resources", path, container_id)


def runc_delete(container_id):
    """Kill and delete a container (its scope goes with it)."""
    _runc("kill", container_id, "KILL", check=False)
    _runc("delete", "--force", container_id, check=False)


def runc_delete_all():
    p = _runc("list", "--quiet", check=False)
    for cid in p.stdout.split():
        runc_delete(cid)


def runc_pod(name, request, limit, *, current=True):
    """A Burstable pod made as the kubelet and containerd make it: its slice (MemoryMax = the pod's
    limit), its pause container, and one app container (`request`/`limit` in MiB) configured as a
    current kubelet does (KUBELET_UNIFIED) or an older one (swap = limit, no unified map), all run
    by runc. Returns (the pod as /pods lists it, {'slice', 'pause', 'app', 'id'})."""
    mib = 1 << 20
    pod = make_pod(name, [{"name": "app", "requests": {"memory": f"{request}Mi"}, "limits": {"memory": f"{limit}Mi"}}])
    slice_name = create_pod_slice(pod["metadata"]["uid"], "burstable", MemoryMax=limit * mib)
    pause = runc_run(slice_name)
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    app = runc_run(slice_name, cid, limit=limit * mib, swap=limit * mib, unified=KUBELET_UNIFIED if current else None)
    return pod, {"slice": slice_name, "pause": pause["scope"], "app": app["scope"], "id": cid}


def cgroup_settings(unit):
    """Every setting file of the unit's cgroup as the kernel shows it now: {file: text}. Settings
    are the writable files of the controllers (cpu.*, io.*, memory.*, pids.*, ...), not cgroup.*
    core files; write-only files (memory.reclaim) and the PSI files (*.pressure) are left out."""
    import stat

    base = cgroup_path(unit)
    out = {}
    for name in sorted(os.listdir(base)):
        if name.startswith("cgroup."):
            continue
        path = os.path.join(base, name)
        mode = os.stat(path).st_mode
        if (not stat.S_ISREG(mode) or not mode & stat.S_IWUSR or not mode & stat.S_IRUSR
                or name.endswith(".pressure")):  # PSI: writable to register triggers, read as stats
            continue
        try:
            with open(path) as f:
                out[name] = f.read().strip()
        except OSError:
            continue
    return out


__all__ += ["RUNC", "KUBELET_UNIFIED", "runc_run", "runc_update", "runc_delete", "runc_delete_all",
            "runc_pod", "cgroup_settings"]
