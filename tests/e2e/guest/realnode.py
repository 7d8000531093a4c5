"""The real node in the guest (issue 41): containerd 2 with Debian's runc and the systemd cgroup
driver, and the kubelet of v1.37.2 standalone (no API server: static pods from staticPodPath,
hostNetwork so no CNI), with the pods' images built here as OCI archives and imported with ctr.

The binaries come from the payload's bin/ (the host's Go cache, scripts/build-go.sh; vm.py copies
them). A scenario that uses this:

    from realnode import *
    node = RealNode()                      # skips without the binaries; stops it all at exit
    node.kubelet_start(kubelet_config(policy="TieredReservation"))
    node.run_pods([static_pod("db", "Guaranteed", ...)])

The kubelet serves 10250 with its self-signed kubelet.crt (as kubeadm's does), anonymous
authentication and AlwaysAllow authorization: without an API server it has no TokenReview to ask,
so the daemon's packaged config (bearer token, caFile kubelet.crt) is accepted as any request is.
"""
import atexit
import hashlib
import io
import json
import os
import shutil
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.request

from memqos_e2e import (CGROUP_ROOT, KUBELET_UNIT, SystemdError, check, log, skip, systemctl,
                        unit_exists, wait_for)

PAYLOAD = os.environ.get("MEMQOS_E2E_PAYLOAD", "")
BIN_DIR = os.path.join(PAYLOAD, "bin")
BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
LOCAL_BIN = "/usr/local/bin"
RUNC = "/usr/sbin/runc"  # Debian's 1.1.5 (tests/e2e/README.md, "The real runtime")
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBELET_CERT = "/var/lib/kubelet/pki/kubelet.crt"
MANIFESTS = "/etc/kubernetes/manifests"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CONTAINERD_UNIT = "containerd.service"
PAUSE_IMAGE = "localhost/memqos-e2e/pause:1"
WORKLOAD_IMAGE = "localhost/memqos-e2e/busybox:1"
HEALTHZ = "http://127.0.0.1:10248/healthz"
KUBELET_URL = "https://127.0.0.1:10250"
KUBE_RESERVED = 192 << 20  # kube.slice: the kubelet runs there, and it is enforced (MemoryMax)
EVICTION_HARD = 64 << 20

__all__ = ["RealNode", "BusMonitor", "KernelSampler", "unit_from_path", "kubelet_config", "static_pod", "KUBELET_CONFIG", "MANIFESTS",
           "PAUSE_IMAGE", "WORKLOAD_IMAGE", "KUBE_RESERVED", "EVICTION_HARD", "kubelet_get",
           "node_pods", "pod_units"]


def _unit_text(description, exec_start, extra=""):
    return f"""[Unit]
Description={description} (memqos e2e, issue 41)

[Service]
ExecStart={exec_start}
{extra}
"""


CONTAINERD_TOML = f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
                    "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{CONTAINERD_SOCK}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

# What `ctr images import` unpacks for (without it containerd 2.4.2's transfer service answers
# "no unpack platforms defined"; tried on the host with these binaries).
[plugins.'io.containerd.transfer.v1.local']
  [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
    platform = "linux/amd64"
    snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "{RUNC}"
    SystemdCgroup = true
"""


def kubelet_config(gate=True, policy=None, factor=None, **extra):
    """A KubeletConfiguration for the guest: the systemd driver, static pods, kube-reserved
    enforced on kube.slice (where the kubelet runs), and the Memory QoS knobs of the issue's
    configurations: (a) kubelet_config(), (b) policy="TieredReservation", (c) and factor=0.9,
    (d) gate=False. `None` leaves a knob unset (the kubelet's default)."""
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "systemd",
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "staticPodPath": MANIFESTS,
        "fileCheckFrequency": "2s",
        "syncFrequency": "10s",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {}},
        "authorization": {"mode": "AlwaysAllow"},
        "readOnlyPort": 0,
        "failSwapOn": False,
        "kubeReserved": {"memory": f"{KUBE_RESERVED >> 20}Mi"},
        "kubeReservedCgroup": "/kube.slice",
        "enforceNodeAllocatable": ["pods", "kube-reserved"],
        "evictionHard": {"memory.available": f"{EVICTION_HARD >> 20}Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "featureGates": {"MemoryQoS": bool(gate)},
    }
    if policy is not None:
        doc["memoryReservationPolicy"] = policy
    if factor is not None:
        doc["memoryThrottlingFactor"] = factor
    doc.update(extra)
    return doc


def static_pod(name, containers, grace=1):
    """A static pod on the host network running `sleep` in the workload image.
    containers: [{"name", "requests": {...}, "limits": {...}}] (QoS follows from them)."""
    spec_containers = []
    for c in containers:
        res = {k: c[k] for k in ("requests", "limits") if c.get(k)}
        spec_containers.append({
            "name": c["name"], "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", c.get("command", "trap 'exit 0' TERM; sleep 1000000 & wait")],
            "resources": res,
        })
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"memqos-e2e": "1"}},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": grace,
                     "containers": spec_containers}}


# ---- images: OCI archives from Debian's busybox-static, imported with ctr -------------------------

def _tar_add(tar, name, data=None, mode=0o755, link=None, dir_=False):
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.mode = mode
    if dir_:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif link:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _busybox_layer():
    """One layer: /bin/busybox and the applets the pods use, /etc/passwd, /tmp."""
    with open("/bin/busybox", "rb") as f:
        busybox = f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            _tar_add(tar, d, dir_=True, mode=0o1777 if d == "tmp" else 0o755)
        _tar_add(tar, "bin/busybox", busybox)
        for applet in ("sh", "sleep", "cat", "dd", "head", "true", "ls", "mkdir", "rm"):
            _tar_add(tar, f"bin/{applet}", link="busybox")
        _tar_add(tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", mode=0o644)
        _tar_add(tar, "etc/group", b"root:x:0:\n", mode=0o644)
    return buf.getvalue()


def _blob(tar, data, media_type):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _tar_add(tar, "blobs/sha256/" + digest.split(":", 1)[1], data, mode=0o644)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def oci_archive(images):
    """An OCI image layout as a tar: images {name: entrypoint argv}, all on one busybox layer."""
    layer = _busybox_layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _tar_add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        layer_desc = _blob(tar, layer, "application/vnd.oci.image.layer.v1.tar")
        manifests = []
        for name, argv in images.items():
            config = json.dumps({
                "architecture": "amd64", "os": "linux",
                "config": {"Entrypoint": argv, "Env": ["PATH=/bin"], "WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            }, sort_keys=True).encode()
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": _blob(tar, config, "application/vnd.oci.image.config.v1+json"),
                "layers": [layer_desc],
            }, sort_keys=True).encode()
            desc = _blob(tar, manifest, "application/vnd.oci.image.manifest.v1+json")
            desc["platform"] = {"architecture": "amd64", "os": "linux"}
            desc["annotations"] = {"io.containerd.image.name": name,
                                   "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
            manifests.append(desc)
        _tar_add(tar, "index.json", json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests}).encode(), mode=0o644)
    return buf.getvalue()


# ---- the kubelet's API, as the harness reads it -----------------------------------------------------

def kubelet_get(path, timeout=5.0):
    """GET a path of the kubelet's port 10250 (anonymous; its self-signed certificate)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(KUBELET_URL + path, timeout=timeout, context=ctx) as r:
        return r.read().decode()


def node_pods():
    """The kubelet's /pods items, {} when it does not answer."""
    try:
        # A kubelet with no pod answers "items": null.
        return {p["metadata"]["name"]: p for p in json.loads(kubelet_get("/pods")).get("items") or []}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def _running(pod):
    st = pod.get("status", {}).get("containerStatuses") or []
    return bool(st) and all("running" in (s.get("state") or {}) for s in st)


def pod_units(pod):
    """The pod's slice and its containers' scopes, as the systemd driver names them:
    {"slice": ..., "qos": ..., "scopes": {container name: scope}}."""
    qos = pod["status"]["qosClass"]
    uid = pod["metadata"]["uid"].replace("-", "_")
    slice_ = f"kubepods-pod{uid}.slice" if qos == "Guaranteed" else \
        f"kubepods-{qos.lower()}-pod{uid}.slice"
    scopes = {s["name"]: "cri-containerd-" + s["containerID"].split("://", 1)[1] + ".scope"
              for s in pod["status"].get("containerStatuses") or [] if s.get("containerID")}
    return {"slice": slice_, "qos": qos, "scopes": scopes, "uid": pod["metadata"]["uid"]}


class RealNode:
    """containerd + the real kubelet in this guest, for one scenario. Skips the scenario when the
    payload has no binaries (scripts/build-go.sh builds them; vm.py copies them in). At exit the
    static pods are removed and waited for, and the kubelet and containerd stopped."""

    def __init__(self):
        missing = [b for b in BINARIES if not os.access(os.path.join(BIN_DIR, b), os.X_OK)]
        if missing:
            skip(f"no {', '.join(missing)} in the payload's bin/ (make test builds them with "
                 "scripts/build-go.sh tests/go/kube and tests/go/containerd)")
        for b in BINARIES:
            dst = os.path.join(LOCAL_BIN, b)
            if os.path.islink(dst) or os.path.exists(dst):
                os.unlink(dst)
            os.symlink(os.path.join(BIN_DIR, b), dst)
        os.makedirs(MANIFESTS, exist_ok=True)
        for f in os.listdir(MANIFESTS):
            os.unlink(os.path.join(MANIFESTS, f))
        atexit.register(self.stop)
        self.timing = {}
        self._containerd_start()
        self._import_images()

    # -- containerd
    def _containerd_start(self):
        t = time.monotonic()
        os.makedirs(os.path.dirname(CONTAINERD_CONFIG), exist_ok=True)
        with open(CONTAINERD_CONFIG, "w") as f:
            f.write(CONTAINERD_TOML)
        # The runtime in system.slice with its shims (KillMode=process keeps them across a restart),
        # as a distribution's containerd.service has it; the kubelet alone in kube.slice.
        _write_runtime_unit(CONTAINERD_UNIT, _unit_text(
            "containerd", f"{LOCAL_BIN}/containerd --config {CONTAINERD_CONFIG}",
            "ExecStartPre=-/sbin/modprobe overlay\nType=notify\nDelegate=yes\nKillMode=process\n"
            "LimitNOFILE=infinity\nOOMScoreAdjust=-999\nEnvironment=PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
        p = systemctl("restart", CONTAINERD_UNIT)
        if p.returncode != 0:
            raise SystemdError(f"systemctl restart containerd: {p.stderr.strip()}")
        ok = wait_for(lambda: subprocess.run(["ctr", "version"], capture_output=True).returncode == 0, 60, 0.5)
        self.timing["containerd_start_s"] = round(time.monotonic() - t, 1)
        check(ok, f"containerd {_version('containerd')} answers on {CONTAINERD_SOCK}"
                  f" ({self.timing['containerd_start_s']} s), runc {_version(RUNC).splitlines()[0] if ok else '?'}")

    def _import_images(self):
        t = time.monotonic()
        archive = "/run/memqos-e2e-images.oci.tar"
        with open(archive, "wb") as f:
            f.write(oci_archive({
                # pause: PID 1 of the sandbox, ends on SIGTERM as the real pause does
                PAUSE_IMAGE: ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"],
                WORKLOAD_IMAGE: ["/bin/sh"],
            }))
        p = subprocess.run(["ctr", "-n", "k8s.io", "images", "import", archive], capture_output=True, text=True)
        os.unlink(archive)
        names = subprocess.run(["ctr", "-n", "k8s.io", "images", "ls", "-q"], capture_output=True,
                               text=True).stdout.split()
        self.timing["images_s"] = round(time.monotonic() - t, 1)
        check(PAUSE_IMAGE in names and WORKLOAD_IMAGE in names,
              f"images built here from busybox-static and imported with ctr ({self.timing['images_s']} s): "
              f"{sorted(n for n in names if n.startswith('localhost/'))} {p.stderr.strip()[-200:]}")

    # -- the kubelet
    def kubelet_start(self, config, timeout=120):
        """Write `config` as the kubelet's config file and (re)start kubelet.service; wait for its
        healthz. Returns the seconds from the start job to healthz."""
        import yaml

        os.makedirs(os.path.dirname(KUBELET_CONFIG), exist_ok=True)
        with open(KUBELET_CONFIG + ".tmp", "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        os.replace(KUBELET_CONFIG + ".tmp", KUBELET_CONFIG)
        _write_runtime_unit(KUBELET_UNIT, _unit_text(
            "kubelet v1.37.2", f"{LOCAL_BIN}/kubelet --config={KUBELET_CONFIG} --v=2",
            "Slice=kube.slice\nWants=containerd.service\nAfter=containerd.service\nKillMode=mixed"))
        t = time.monotonic()
        systemctl("reset-failed", KUBELET_UNIT)
        p = systemctl("restart", KUBELET_UNIT)
        if p.returncode != 0:
            raise SystemdError(f"systemctl restart kubelet: {p.stderr.strip()}")
        ok = wait_for(lambda: _healthz(), timeout, 0.25)
        took = round(time.monotonic() - t, 1)
        if not ok:
            log(subprocess.run(["journalctl", "-u", KUBELET_UNIT, "-n", "60", "--no-pager"],
                               capture_output=True, text=True).stdout)
            raise SystemdError(f"the kubelet did not answer {HEALTHZ} within {timeout} s")
        return took

    def kubelet_stop(self):
        systemctl("stop", KUBELET_UNIT)

    # -- static pods
    def run_pods(self, pods, timeout=180):
        """Write the static pods' manifests and wait until the kubelet lists every one running.
        Returns {name: pod_units(pod)} (names as given: the kubelet appends -<node>)."""
        for pod in pods:
            path = os.path.join(MANIFESTS, pod["metadata"]["name"] + ".json")
            with open(path + ".tmp", "w") as f:
                json.dump(pod, f)
            os.replace(path + ".tmp", path)
        names = [p["metadata"]["name"] for p in pods]

        def all_running():
            listed = node_pods()
            found = {n: next((p for k, p in listed.items() if k.startswith(n + "-")), None) for n in names}
            return found if all(p and _running(p) for p in found.values()) else None

        found = wait_for(all_running, timeout, 0.5)
        if not found:
            listed = node_pods()
            raise SystemdError(f"static pods {names} not all running within {timeout} s: "
                               f"{ {k: p.get('status', {}).get('containerStatuses') for k, p in listed.items()} }")
        return {n: pod_units(p) for n, p in found.items()}

    def remove_pods(self, names=None, timeout=120):
        """Delete the static pods' manifests (all with names=None) and wait until their slices
        are gone."""
        for f in sorted(os.listdir(MANIFESTS)):
            if names is None or f[:-len(".json")] in names:
                os.unlink(os.path.join(MANIFESTS, f))

        def gone():
            listed = node_pods()
            return not any(names is None or any(k.startswith(n + "-") for n in names) for k in listed)

        return wait_for(gone, timeout, 0.5)

    def stop(self):
        """Everything down: the pods (their manifests removed, waited for), the kubelet, containerd."""
        try:
            if unit_exists(KUBELET_UNIT) and _healthz():
                self.remove_pods(timeout=90)
                wait_for(lambda: not _pod_slices(), 60, 0.5)
        except Exception as e:
            log(f"realnode: removing the pods: {e!r}")
        for unit in (KUBELET_UNIT, CONTAINERD_UNIT):
            systemctl("stop", unit)
        for unit in (KUBELET_UNIT, CONTAINERD_UNIT):
            path = "/run/systemd/system/" + unit
            if os.path.exists(path):
                os.unlink(path)
        # What the kubelet set on kube.slice (the reservation enforced: MemoryMax, MemoryMin) is a
        # runtime drop-in that would outlive the scenario (the driver drops kubepods*'s only).
        shutil.rmtree("/run/systemd/system.control/kube.slice.d", ignore_errors=True)
        systemctl("daemon-reload")
        systemctl("reset-failed")


def _pod_slices():
    base = os.path.join(CGROUP_ROOT, "kubepods.slice")
    found = []
    for root, dirs, _ in os.walk(base) if os.path.isdir(base) else ():
        found += [d for d in dirs if "-pod" in d]
    return found


def _healthz():
    try:
        with urllib.request.urlopen(HEALTHZ, timeout=2) as r:
            return r.read().strip() == b"ok"
    except OSError:
        return False


def _version(binary):
    p = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (p.stdout or p.stderr).strip()


def _write_runtime_unit(unit, text):
    path = "/run/systemd/system/" + unit
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)
    systemctl("daemon-reload")


# ---- watching the node: who calls systemd, and what the kernel holds --------------------------------

def unit_from_path(path):
    """/org/freedesktop/systemd1/unit/kubepods_2dburstable_2eslice -> kubepods-burstable.slice"""
    import re

    name = path.rsplit("/", 1)[-1]
    return re.sub(r"_([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), name)


def _plain(v):
    """busctl's JSON of a variant ({"type": "t", "data": 5}) as its value."""
    if isinstance(v, dict) and "data" in v:
        return _plain(v["data"])
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


class BusMonitor:
    """Every call that starts a unit or sets a unit's properties on systemd, with who made it:
    `busctl monitor` (the bus's monitoring interface) with matches on SetUnitProperties,
    Unit.SetProperties and StartTransientUnit. Each sender is named by its process's unit and comm,
    e.g. "kubelet.service/kubelet" (looked up at first sight; a process gone by then, e.g. a
    short-lived runc, is "exited").

    .calls(): [{"t": monotonic, "who", "member", "unit", "props": {name: value}}]."""

    MEMBERS = ("SetUnitProperties", "SetProperties", "StartTransientUnit")

    def __init__(self):
        matches = [f"type='method_call',destination='org.freedesktop.systemd1',member='{m}'"
                   for m in self.MEMBERS]
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "busctl", "monitor", "--system", "--json=short", *(f"--match={m}" for m in matches)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._calls, self._who, self._ids, self._lock = [], {}, {}, threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        atexit.register(self.close)
        time.sleep(0.5)  # the monitor is attached (busctl prints nothing before)

    def _name(self, sender):
        if sender in self._who:
            return self._who[sender]
        who = "exited"
        p = subprocess.run(["busctl", "--system", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                            "org.freedesktop.DBus", "GetConnectionUnixProcessID", "s", sender],
                           capture_output=True, text=True)
        if p.returncode == 0:
            pid = p.stdout.split()[-1]
            try:  # its unit (the last part of its cgroup), e.g. kubelet.service
                with open(f"/proc/{pid}/cgroup") as f:
                    who = f.read().strip().rsplit("/", 1)[-1] or "?"
                with open(f"/proc/{pid}/comm") as f:
                    who += "/" + f.read().strip()
            except OSError:
                pass
        self._who[sender] = who
        return who

    def _unit_of(self, path):
        """The unit of an object path: its name escaped, or its invocation ID (32 hex digits, the
        path systemd gives a unit loaded by GetUnitByInvocationID or answered by GetUnit since 240),
        asked of systemd once."""
        import re

        tail = path.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[0-9a-f]{32}", tail):
            return unit_from_path(path)
        if tail not in self._ids:
            p = subprocess.run(["busctl", "--system", "get-property", "org.freedesktop.systemd1", path,
                                "org.freedesktop.systemd1.Unit", "Id"], capture_output=True, text=True)
            parts = p.stdout.split('"')
            self._ids[tail] = parts[1] if p.returncode == 0 and len(parts) > 1 else tail
        return self._ids[tail]

    def _read(self):
        # busctl's output to a pipe is block-buffered (stdbuf -oL makes it a line each): a message
        # may still be read a little after it was sent, so its time is the bus's own stamp
        # (realtime) taken to the monotonic clock.
        offset = time.time() - time.monotonic()
        for line in self.proc.stdout:
            t = time.monotonic()
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            stamp = msg.get("timestamp-realtime")
            if isinstance(stamp, int) and stamp > 0:
                t = min(t, stamp / 1e6 - offset)
            member = msg.get("member")
            if msg.get("type") != "method_call" or member not in self.MEMBERS:
                continue
            data = _plain((msg.get("payload") or {}).get("data") or [])
            if member == "SetProperties":  # Unit.SetProperties(runtime, props) on the unit's path
                unit, props = self._unit_of(msg.get("path", "")), data[1]
            elif member == "SetUnitProperties":  # (name, runtime, props)
                unit, props = data[0], data[2]
            else:  # StartTransientUnit(name, mode, props, aux)
                unit, props = data[0], data[2]
            call = {"t": t, "who": self._name(msg.get("sender", "?")), "member": member, "unit": unit,
                    "props": {k: v for k, v in props}}
            with self._lock:
                self._calls.append(call)

    def calls(self, since=None, until=None, who=None, unit=None):
        """The calls in [since, until), by `who` (a sender's unit, e.g. kubelet.service), to `unit`
        (a name or a predicate)."""
        def keep(c):
            return ((since is None or c["t"] >= since) and (until is None or c["t"] < until)
                    and (who is None or c["who"].split("/")[0] == who)
                    and (unit is None or (unit(c["unit"]) if callable(unit) else c["unit"] == unit)))

        with self._lock:
            return [c for c in self._calls if keep(c)]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


MEMORY_FILES = ("memory.min", "memory.low", "memory.high", "memory.max")


class KernelSampler(threading.Thread):
    """memory.min/low/high/max of kubepods.slice and every cgroup below it, and of kube.slice, every
    `interval` s (pread on descriptors kept open; the tree re-listed every second). Keeps, per
    cgroup (its unit name) and file, each value seen with the time it was first seen:
    .timeline[(unit, file)] = [(t, value)] (max as UINT64_MAX-free None)."""

    def __init__(self, interval=0.02, roots=("kubepods.slice", "kube.slice")):
        super().__init__(daemon=True)
        self.interval, self.roots = interval, roots
        self.timeline, self.samples = {}, 0
        self._halt = threading.Event()
        self._fds = {}
        self.start()
        atexit.register(self.close)

    def _rescan(self):
        seen = set()
        for root in self.roots:
            base = os.path.join(CGROUP_ROOT, root)
            for dirpath, dirs, _ in os.walk(base):
                unit = os.path.basename(dirpath)
                if not (unit.endswith(".slice") or unit.endswith(".scope")):
                    dirs[:] = []
                    continue
                for f in MEMORY_FILES:
                    key = (unit, f)
                    seen.add(key)
                    if key not in self._fds:
                        try:
                            self._fds[key] = os.open(os.path.join(dirpath, f), os.O_RDONLY)
                        except OSError:
                            pass
        for key in [k for k in self._fds if k not in seen]:
            os.close(self._fds.pop(key))

    def run(self):
        last_scan = 0.0
        while not self._halt.is_set():
            now = time.monotonic()
            if now - last_scan >= 1.0:
                self._rescan()
                last_scan = now
            for key, fd in list(self._fds.items()):
                try:
                    text = os.pread(fd, 32, 0).strip()
                except OSError:  # the cgroup went away
                    continue
                value = None if text == b"max" else int(text or 0)
                line = self.timeline.setdefault(key, [])
                if not line or line[-1][1] != value:
                    line.append((now, value))
            self.samples += 1
            time.sleep(self.interval)

    def values(self, unit, file, since=None, until=None):
        """The values `unit`'s `file` showed in [since, until): the one in force at `since` and
        every later one."""
        line = self.timeline.get((unit, file), [])
        out = []
        for i, (t, v) in enumerate(line):
            nxt = line[i + 1][0] if i + 1 < len(line) else float("inf")
            if (since is None or nxt > since) and (until is None or t < until):
                out.append(v)
        return out

    def close(self):
        self._halt.set()
        if self.is_alive():
            self.join(timeout=2)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
