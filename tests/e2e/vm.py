"""Host-side runner for the memqos-systemd e2e VM (Python stdlib only).

    from vm import run_vm, build_image, build_payload
    results = run_vm(payload_dir, timeout=900)

boots the cached Debian guest (see build-image.sh) under qemu/TCG with a copy-on-write overlay of
the base image and a per-run share disk holding the payload, waits for the guest to power off and
returns the directory with the guest's results (<scenario>.json, logs, journal.txt, summary.json).
serial.log, qemu.log and timing.json sit next to it (in the run directory).

Also a command line: `python3 tests/e2e/vm.py [--keep] [--transport disk|9p] [SCENARIO ...]`.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD_SCRIPT = os.path.join(HERE, "build-image.sh")
CTL_PORT_NAME = "org.memqos.e2e.0"
SHARE_LABEL = "MQSHARE"
MAX_BOOTS = 10
# The real node's programs (guest/realnode.py), built from the Go module proxy and cached by
# scripts/build-go.sh; the payload carries in bin/ those its scenarios name in a header line
# `# e2e-go: kubelet containerd ...` (among their first 30 lines).
GO_HEADER_RE = re.compile(r"^#\s*e2e-go:\s*(.+?)\s*$")
FOLLOW_EVERY = 2.0  # seconds between looks at the serial log for on_serial_line
# The guest driver's line for a finished scenario (run-scenarios, say()), as the serial log has it:
# `... run-scenarios: === 00-smoke: passed (exit 0, 12.3 s, 20 checks, 0 failed)`; group 1 from ===.
FINISHED_RE = re.compile(r"run-scenarios: (=== \S+: (?:passed|failed|timeout|skipped|error|driver error)\b.*)$")
DEFAULT_APPEND = ("root=/dev/vda rw console=ttyS0 panic=1 quiet loglevel=4 "
                  "systemd.unified_cgroup_hierarchy=1 systemd.show_status=error")


class VMError(RuntimeError):
    """The VM did not produce a complete result. .run_dir/.results_dir may hold partial ones."""

    def __init__(self, message, run_dir=None, results_dir=None, serial_tail=""):
        super().__init__(message + (f"\n--- serial log tail ---\n{serial_tail}" if serial_tail
                                    else ""))
        self.run_dir = run_dir
        self.results_dir = results_dir
        self.serial_tail = serial_tail


class VMTimeout(VMError):
    pass


def missing_prerequisites(need_build=True):
    """Reasons the harness cannot run here (empty list: it can)."""
    missing = []
    tools = ["qemu-system-x86_64", "qemu-img", "mkfs.ext4", "debugfs"]
    if need_build:
        tools += ["debootstrap", "chroot", "flock"]
    for tool in tools:
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            missing.append(f"{tool} not found")
    if need_build and os.geteuid() != 0:
        missing.append("building the image needs root (debootstrap, chroot)")
    return missing


def image_is_cached():
    key = subprocess.run(["bash", BUILD_SCRIPT, "--key"], capture_output=True, text=True,
                         check=True).stdout.strip()
    cache = os.environ.get("MEMQOS_E2E_CACHE", "/var/cache/memqos-e2e")
    return os.path.isfile(os.path.join(cache, key, "image.json"))


def build_image(log=None):
    """Build or reuse the cached image; return its directory. The build's output goes to log (a
    file object) or to build-<time>.log in the cache; its tail is in the VMError on failure."""
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    cache = os.environ.get("MEMQOS_E2E_CACHE", "/var/cache/memqos-e2e")
    log_path = None
    if log is None:
        os.makedirs(cache, exist_ok=True)
        log_path = os.path.join(cache, time.strftime("build-%Y%m%d-%H%M%S.log"))
        log = open(log_path, "w")
    try:
        p = subprocess.run(["bash", BUILD_SCRIPT], stdout=subprocess.PIPE, stderr=log,
                           text=True, env=env)
    finally:
        if log_path:
            log.close()
    if p.returncode != 0:
        raise VMError(f"build-image.sh failed (exit {p.returncode})"
                      + (f"; log {log_path}" if log_path else ""),
                      serial_tail=_tail(log_path, 40) if log_path else "")
    if log_path:
        os.unlink(log_path)  # nothing to keep from a successful build or a cache hit
    return p.stdout.strip().splitlines()[-1]


def scenario_go_programs(scenarios=None):
    """The Go programs the scenarios (names without extension; None: all) say they need in their
    `# e2e-go:` header, in order of first mention."""
    names = []
    for name in list_scenarios() if scenarios is None else scenarios:
        for ext in (".sh", ".py"):
            path = os.path.join(HERE, "scenarios", name + ext)
            if not os.path.exists(path):
                continue
            with open(path, errors="replace") as f:
                for _, line in zip(range(30), f):
                    m = GO_HEADER_RE.match(line.strip())
                    if m:
                        names += [n for n in m.group(1).split() if n not in names]
    return names


def go_programs(names, repo=REPO):
    """{name: path} of the Go programs, built or found in the cache by scripts/build-go.sh (a cache
    hit takes milliseconds; the first build minutes, see README). {} when Go is missing or the
    build fails: the scenarios that need them then skip, saying why (and fail under CI=true)."""
    script = os.path.join(repo, "scripts", "build-go.sh")
    if not names or not os.path.exists(script):
        return {}
    p = subprocess.run(["bash", script, *names], stdout=subprocess.PIPE, text=True)
    paths = p.stdout.split()
    if p.returncode != 0 or len(paths) != len(names):
        print(f"vm.py: scripts/build-go.sh {' '.join(names)} failed (exit {p.returncode}); "
              "the payload has no bin/", file=sys.stderr)
        return {}
    return dict(zip(names, paths))


def build_payload(dest, scenarios=None, debs=None, repo=REPO, default_timeout=None, programs=None):
    """Gather a payload directory: guest/ helpers, scenarios/, debs/ (build/deb/*.deb unless debs
    is given), examples/, the memqos_systemd package source (src/), the benchmarks' guest
    workloads (bench/guest/ as bench/) when the repo has them, and bin/ with the real node's Go
    programs (programs: {name: path}; by default those the scenarios name, scenario_go_programs()). (Not monitoring/: 65-alerts
    loads the rules the .deb installs.)
    scenarios: list of scenario names (without extension) to run; None runs all."""
    os.makedirs(dest, exist_ok=True)
    programs = go_programs(scenario_go_programs(scenarios), repo=repo) if programs is None else programs
    if programs:
        os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
        for name, path in programs.items():
            shutil.copy(path, os.path.join(dest, "bin", name))
    shutil.copytree(os.path.join(HERE, "guest"), os.path.join(dest, "guest"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(os.path.join(HERE, "scenarios"), os.path.join(dest, "scenarios"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*~"))
    if debs is None:
        deb_dir = os.path.join(repo, "build", "deb")
        debs = sorted(os.path.join(deb_dir, f) for f in os.listdir(deb_dir)
                      if f.endswith(".deb")) if os.path.isdir(deb_dir) else []
    if debs:
        os.makedirs(os.path.join(dest, "debs"), exist_ok=True)
        for deb in debs:
            shutil.copy(deb, os.path.join(dest, "debs"))
    # The DaemonSet route (18-daemonset): the image `make image` built from the .deb, and the
    # manifests rendered as `kubectl apply -k` would (tests/manifests.py), as JSON for the guest.
    image_dir = os.path.join(repo, "build", "image")
    images = sorted(f for f in os.listdir(image_dir) if f.endswith(".oci.tar")) if os.path.isdir(image_dir) else []
    if images and os.path.isdir(os.path.join(repo, "deploy", "kubernetes")):
        os.makedirs(os.path.join(dest, "images"), exist_ok=True)
        shutil.copy(os.path.join(image_dir, images[-1]), os.path.join(dest, "images"))
        sys.path.insert(0, os.path.join(repo, "tests"))
        import manifests

        os.makedirs(os.path.join(dest, "deploy"), exist_ok=True)
        for d in ("kubernetes", "kubernetes-uninstall"):
            with open(os.path.join(dest, "deploy", d + ".json"), "w") as f:
                json.dump(manifests.render(os.path.join(repo, "deploy", d)), f, indent=1)
    for src, name in ((os.path.join(repo, "examples"), "examples"),
                      (os.path.join(repo, "memqos_systemd"), "src/memqos_systemd"),
                      (os.path.join(repo, "bench", "guest"), "bench")):
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, name),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    config = {"scenarios": scenarios}
    if default_timeout:
        config["default_timeout"] = int(default_timeout)
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump(config, f)
    return dest


def list_scenarios():
    import re

    pat = re.compile(r"^\d\d-[A-Za-z0-9_.-]+\.(sh|py)$")
    d = os.path.join(HERE, "scenarios")
    return sorted(os.path.splitext(f)[0] for f in os.listdir(d) if pat.match(f))


def _dir_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _tail(path, lines=60):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.replace("\r", "").splitlines()[-lines:])


class QMP:
    """Minimal QMP client over a unix socket; thread safe, skips async events."""

    def __init__(self, path, timeout=30.0):
        self.path = path
        self.timeout = timeout
        self.lock = threading.Lock()
        self.sock = None
        self.file = None
        self.events = []
        self.counter = 0

    def _connect(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(self.timeout)
                s.connect(self.path)
                break
            except OSError:
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.sock, self.file = s, s.makefile("rw")
        json.loads(self.file.readline())  # greeting
        self._exec("qmp_capabilities", {})

    def _exec(self, execute, arguments):
        self.counter += 1
        cid = f"mq{self.counter}"
        msg = {"execute": execute, "id": cid}
        if arguments:
            msg["arguments"] = arguments
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()
        while True:
            line = self.file.readline()
            if not line:
                raise VMError("QMP connection closed")
            r = json.loads(line)
            if "event" in r:
                self.events.append(r)
                continue
            if r.get("id") != cid:
                continue
            if "error" in r:
                raise VMError(f"QMP {execute}: {r['error'].get('desc', r['error'])}")
            return r.get("return")

    def __call__(self, execute, **arguments):
        with self.lock:
            if self.file is None:
                self._connect()
            return self._exec(execute, arguments)

    def close(self):
        if self.sock:
            self.sock.close()


class VM:
    """Handle given to on_booted and request handlers."""

    def __init__(self, run_dir, results_dir, serial_log, qmp):
        self.run_dir = run_dir
        self.results_dir = results_dir
        self.serial_log = serial_log
        self._qmp = qmp
        self.timing = {}
        self.boots = 0  # 1 during the first boot; +1 for each reboot the guest asked for
        self._dimms = 0
        self._lock = threading.Lock()

    def qmp(self, execute, **arguments):
        if self._qmp is None:
            raise VMError("this VM was started with qmp=False")
        return self._qmp(execute, **arguments)

    def hotplug_memory(self, size_mib=512):
        """Hot-add a pc-dimm (needs slots/maxmem in the -m option). Returns the device id."""
        with self._lock:
            self._dimms += 1
            n = self._dimms
        self.qmp("object-add", **{"qom-type": "memory-backend-ram", "id": f"mem-hp{n}",
                                  "size": int(size_mib) << 20})
        self.qmp("device_add", driver="pc-dimm", id=f"dimm-hp{n}", memdev=f"mem-hp{n}")
        return f"dimm-hp{n}"


class _Control(threading.Thread):
    """Reads JSON-line requests from the guest's virtio-serial port and answers them."""

    def __init__(self, path, vm, proc, on_booted, handlers, t0):
        super().__init__(daemon=True)
        self.path, self.vm, self.proc = path, vm, proc
        self.on_booted, self.handlers, self.t0 = on_booted, handlers, t0
        self.error = None

    def _handle(self, msg):
        op = msg.get("op")
        if op == "booted":
            suffix = "" if self.vm.boots <= 1 else str(self.vm.boots)
            self.vm.timing["booted_s" + suffix] = round(time.monotonic() - self.t0, 1)
            self.vm.timing["guest_uptime_at_driver_start_s" + suffix] = msg.get("uptime")
            if self.on_booted:
                def hook():
                    try:
                        self.on_booted(self.vm)
                    except Exception as e:  # reported after the run
                        self.error = e
                threading.Thread(target=hook, daemon=True).start()
            return {}
        if op == "done":
            self.vm.timing["done_s"] = round(time.monotonic() - self.t0, 1)
            return {}
        if op == "qmp":
            return {"return": self.vm.qmp(msg["execute"], **(msg.get("arguments") or {}))}
        if op == "hotplug-memory":
            return {"device": self.vm.hotplug_memory(msg.get("size_mib", 512))}
        if op in self.handlers:
            return self.handlers[op](self.vm, msg) or {}
        raise VMError(f"unknown request {op!r}")

    def run(self):
        s = socket.socket(socket.AF_UNIX)
        while self.proc.poll() is None:
            try:
                s.connect(self.path)
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        f = s.makefile("rwb")
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            try:
                reply = dict(self._handle(msg), ok=True)
            except Exception as e:
                reply = {"ok": False, "error": str(e)}
            reply["id"] = msg.get("id")
            try:
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()
            except OSError:
                break


def _prune_runs(root, keep):
    """Delete all but the newest `keep` run directories (logs and results; a few MB at most)."""
    runs = sorted((e for e in os.scandir(root) if e.is_dir() and e.name.startswith("run-")),
                  key=lambda e: e.stat().st_mtime, reverse=True)
    for entry in runs[max(keep - 1, 0):]:
        shutil.rmtree(entry.path, ignore_errors=True)


def _runs_root():
    return os.environ.get("MEMQOS_E2E_RUNS", "/var/tmp/memqos-e2e-runs")


class _Follower:
    """The lines appended to a file since the last look (the serial log, across boots)."""

    def __init__(self, path, on_line):
        self.path, self.on_line = path, on_line
        self.offset, self.partial = 0, b""

    def poll(self):
        if self.on_line is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.on_line(line.decode("utf-8", "replace").rstrip("\r"))


def run_vm(payload_dir, timeout, memory="1G,slots=2,maxmem=2G", qmp=True, on_booted=None, *,
           image=None, smp=2, transport=None, run_dir=None, keep=None, handlers=None,
           append="", on_serial_line=None):
    """Boot the guest with payload_dir as its payload; return the results directory.

    timeout: hard limit in seconds for the whole VM run (all boots); on expiry qemu is killed and
    VMTimeout is raised (partial results, if any, are in e.results_dir). on_booted(vm) runs in a
    thread each time the guest driver started (vm.boots tells which boot; vm.qmp(...),
    vm.hotplug_memory(...)). handlers: {op: fn(vm, msg)}
    for extra guest requests. on_serial_line(line) sees each line of the guest's serial console
    while it runs (checked every FOLLOW_EVERY s). transport: 'disk' (default, MEMQOS_E2E_TRANSPORT) or '9p'.
    keep: keep the overlay and share images (default: MEMQOS_E2E_KEEP=1).
    """
    image = image or build_image()
    transport = transport or os.environ.get("MEMQOS_E2E_TRANSPORT", "disk")
    if keep is None:
        keep = os.environ.get("MEMQOS_E2E_KEEP") == "1"
    if run_dir is None:
        os.makedirs(_runs_root(), exist_ok=True)
        _prune_runs(_runs_root(), keep=int(os.environ.get("MEMQOS_E2E_KEEP_RUNS", 20)))
        run_dir = tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%d-%H%M%S-"), dir=_runs_root())
    os.makedirs(run_dir, exist_ok=True)
    serial_log = os.path.join(run_dir, "serial.log")
    results_dir = os.path.join(run_dir, "results")
    sockdir = tempfile.mkdtemp(prefix="mqe2e-")  # unix socket paths must stay short
    overlay = os.path.join(run_dir, "root-overlay.qcow2")
    share_img = os.path.join(run_dir, "share.img")
    share_dir = os.path.join(run_dir, "share")
    timing = {"transport": transport}
    t_setup = time.monotonic()

    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                    os.path.join(image, "root.img"), overlay], check=True)
    os.makedirs(share_dir)
    shutil.copytree(payload_dir, os.path.join(share_dir, "payload"), symlinks=False)
    os.makedirs(os.path.join(share_dir, "results"))
    if transport == "disk":
        size_mib = _dir_size(share_dir) // (1 << 20) + 512
        # No journal: everything the guest wrote (mounted -o sync) is readable with debugfs
        # even after qemu was killed.
        subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", SHARE_LABEL, "-d",
                        share_dir, share_img, f"{size_mib}M"], check=True,
                       stdout=subprocess.DEVNULL)
        share_args = ["-drive", f"file={share_img},if=virtio,format=raw,cache=writeback"]
    elif transport == "9p":
        results_dir = os.path.join(share_dir, "results")
        share_args = ["-fsdev", f"local,id=mqshare,path={share_dir},security_model=none",
                      "-device", "virtio-9p-pci,fsdev=mqshare,mount_tag=memqos"]
    else:
        raise ValueError(f"unknown transport {transport!r}")
    timing["setup_s"] = round(time.monotonic() - t_setup, 2)

    qmp_sock = os.path.join(sockdir, "qmp.sock")
    ctl_sock = os.path.join(sockdir, "ctl.sock")
    cmd = [
        "qemu-system-x86_64", "-name", "memqos-e2e",
        "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(smp), "-m", memory,
        "-nodefaults", "-no-user-config", "-display", "none", "-vga", "none", "-no-reboot",
        # append=on: every boot of a run (see reboot support) goes into the one serial.log
        "-chardev", f"file,id=mqserial,path={serial_log},append=on", "-serial", "chardev:mqserial",
        "-kernel", os.path.join(image, "vmlinuz"), "-initrd", os.path.join(image, "initrd.img"),
        "-append", f"{DEFAULT_APPEND} memqos.transport={transport} {append}".strip(),
        "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        *share_args,
        "-device", "virtio-rng-pci",
        "-device", "virtio-serial-pci,id=vser0",
        "-chardev", f"socket,id=mqctl,path={ctl_sock},server=on,wait=off",
        "-device", f"virtserialport,bus=vser0.0,chardev=mqctl,name={CTL_PORT_NAME}",
    ]
    if qmp:
        cmd += ["-qmp", f"unix:{qmp_sock},server=on,wait=off"]
    with open(os.path.join(run_dir, "qemu-cmdline.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")

    vm = VM(run_dir, results_dir, serial_log, None)
    vm.timing = timing
    follower = _Follower(serial_log, on_serial_line)
    t0 = time.monotonic()
    deadline = t0 + timeout
    timed_out = False
    hook_errors = []
    qlog = open(os.path.join(run_dir, "qemu.log"), "w")
    try:
        # One qemu per boot: the guest's reboot (memqos_e2e.reboot()) ends qemu (-no-reboot);
        # if the guest left a pending .resume.json, boot the same overlay and share again.
        while True:
            vm.boots += 1
            qmp_client = QMP(qmp_sock) if qmp else None
            vm._qmp = qmp_client
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qlog,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            control = _Control(ctl_sock, vm, proc, on_booted, handlers or {}, t0)
            control.start()
            try:
                while True:  # wait for qemu, passing on the serial console's new lines meanwhile
                    try:
                        proc.wait(timeout=max(0.1, min(FOLLOW_EVERY, deadline - time.monotonic())))
                        break
                    except subprocess.TimeoutExpired:
                        follower.poll()
                        if time.monotonic() >= deadline:
                            raise
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                follower.poll()
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                if qmp_client:
                    qmp_client.close()
                control.join(timeout=5)
                for sock in (qmp_sock, ctl_sock):
                    if os.path.exists(sock):
                        os.unlink(sock)
            if control.error is not None:
                hook_errors.append(control.error)
            if timed_out or _share_file(transport, share_img, share_dir, "summary.json"):
                break
            if not _share_file(transport, share_img, share_dir, ".resume.json"):
                break
            if vm.boots >= MAX_BOOTS:
                break
            timing[f"boot{vm.boots}_end_s"] = round(time.monotonic() - t0, 1)
    finally:
        qlog.close()
        shutil.rmtree(sockdir, ignore_errors=True)
    timing["qemu_s"] = round(time.monotonic() - t0, 1)
    timing["qemu_exit"] = proc.returncode
    timing["boots"] = vm.boots

    if transport == "disk":
        t_x = time.monotonic()
        p = subprocess.run(["debugfs", "-R", f"rdump /results {run_dir}", share_img],
                           capture_output=True, text=True)
        timing["extract_s"] = round(time.monotonic() - t_x, 2)
        if p.returncode != 0 or not os.path.isdir(results_dir):
            os.makedirs(results_dir, exist_ok=True)
            with open(os.path.join(run_dir, "extract-error.txt"), "w") as f:
                f.write(p.stdout + p.stderr)
    if not keep:
        for path in (overlay, share_img):
            if os.path.exists(path):
                os.unlink(path)
        if transport == "disk":
            shutil.rmtree(share_dir, ignore_errors=True)
        else:
            shutil.rmtree(os.path.join(share_dir, "payload"), ignore_errors=True)
    with open(os.path.join(run_dir, "timing.json"), "w") as f:
        json.dump(timing, f, indent=1)

    tail = _tail(serial_log)
    qemu_tail = _tail(os.path.join(run_dir, "qemu.log"), 20)
    if qemu_tail:  # qemu's own complaints (bad option, missing file) say more than the guest
        tail = f"{tail}\n--- qemu.log ---\n{qemu_tail}"
    if timed_out:
        raise VMTimeout(f"VM did not finish within {timeout} s (killed); run dir {run_dir}",
                        run_dir, results_dir, tail)
    if not os.path.exists(os.path.join(results_dir, "summary.json")):
        raise VMError(f"qemu exited ({proc.returncode}) before the guest finished; "
                      f"run dir {run_dir}", run_dir, results_dir, tail)
    if hook_errors:
        raise VMError(f"on_booted hook failed: {hook_errors[0]!r}", run_dir, results_dir)
    return results_dir


def _share_file(transport, share_img, share_dir, name):
    """Content of results/<name> on the share ('' if absent), read while qemu is not running."""
    if transport == "9p":
        try:
            with open(os.path.join(share_dir, "results", name)) as f:
                return f.read()
        except OSError:
            return ""
    p = subprocess.run(["debugfs", "-R", f"cat /results/{name}", share_img],
                       capture_output=True, text=True)
    return p.stdout.strip()


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="Boot the e2e guest and run scenarios.")
    ap.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("MEMQOS_E2E_TIMEOUT",
                                                                       1800)))
    ap.add_argument("--transport", choices=("disk", "9p"))
    ap.add_argument("--keep", action="store_true", help="keep overlay and share images")
    ap.add_argument("--memory", default="1G,slots=2,maxmem=2G")
    ap.add_argument("--deb", action="append",
                    help="install this .deb in the guest (default: build/deb/*.deb)")
    args = ap.parse_args(argv)
    image = build_image()
    with tempfile.TemporaryDirectory(prefix="mqe2e-payload-") as payload:
        build_payload(payload, scenarios=args.scenarios or None, debs=args.deb)
        try:
            results = run_vm(payload, args.timeout, memory=args.memory, image=image,
                             transport=args.transport, keep=args.keep or None)
        except VMError as e:
            print(e, file=sys.stderr)
            return 2
    rc = 0
    for name in sorted(f[:-5] for f in os.listdir(results)
                       if f.endswith(".json") and f not in ("summary.json", "install.json")):
        with open(os.path.join(results, name + ".json")) as f:
            r = json.load(f)
        print(f"{r['status']:8} {name} ({r['duration_s']} s)")
        for c in r.get("checks", []):
            print(f"    CHECK {'ok' if c['ok'] else 'fail'} {c['what']}")
        if r["status"] not in ("passed", "skipped"):
            rc = 1
    print(f"results: {results}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
