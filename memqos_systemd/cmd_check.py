"""`check`: whether this machine, its systemd, the config, the kubelet and the pod source are
ready for the service, one finding a line (ok, warn or error; exit 1 on an error). Each feature of
the table says its own findings (Feature.findings); none is named here."""

from __future__ import annotations

import asyncio
import time

from . import columns, fights
from .cmd_common import EXIT_FAILURE, EXIT_OK, SERVICE, connect, fetch, service_counts, systemd_host
from .config import Config
from .kubelet_gate import GATE_FIX, KNOWN_POLICIES, Writes, companion_mode, properties_where, who_writes, \
    who_writes_what, writes, written_how
from .node import check_node, kubelet_config_findings
from .sources import SourceError, kubelet_gates
from .sources.file import hidden_from_service
from .sources.kubelet import unreachable_in_service
from .systemd import SystemdError
from .places import CGROUP_ROOT, FIGHTS_PATH
from .wiring import adds, wire

__all__ = ["check", "NO_POD_SOURCE"]

# check's lines are wrapped to this many columns (a finding's continuation indented under its text).
CHECK_WIDTH = 100


def check(args, cfg: Config) -> int:
    return asyncio.run(_check(cfg))


async def _check(cfg: Config) -> int:
    findings: list[tuple[str, str]] = [(f.level, f"{f.what}: {f.detail}") for f in systemd_host()]
    version = access = None
    try:
        systemd = await connect()
        try:
            version = await systemd.version()
            findings.append(("ok", f"D-Bus: connected to systemd {version}"))
            try:  # what the service's sandbox lets it reach (None: no such service loaded)
                access = await systemd.ip_address_access(SERVICE)
            except SystemdError:
                pass
        finally:
            await systemd.close()
    except SystemdError as e:
        findings.append(("error", f"D-Bus: cannot reach systemd: {e}"))
    for f in check_node(systemd=version, cgroup_root=CGROUP_ROOT):
        findings.append((f.level, f"{f.what}: {f.detail}"))
    set_keys = sorted(k for k, o in cfg.origins.items() if o != "default")
    findings.append(("ok", f"config: policy {cfg.memory_reservation_policy}, hierarchy {cfg.hierarchy}"
                           + (f"; set: {', '.join(set_keys)}" if set_keys else "; all defaults")))
    findings += [("warn", f"config: {note}") for note in cfg.notes]
    for f in kubelet_config_findings(cfg.kubelet_config_file):
        findings.append((f.level, f"{f.what}: {f.detail}"))
    # What the service's sandbox lets it reach of the kubelet: judged, never connected to.
    sandbox = None if cfg.pods_file else unreachable_in_service(cfg.kubelet.url, access)
    blocked = sandbox is not None and sandbox[0] == "error"
    # The pods first: when the kubelet does not answer them, the gate's line says so in a word,
    # and the pods' line says why (one error, named once).
    pods = await _check_pods(cfg, sandbox)
    pods_failed = any(level == "error" for level, _ in pods)
    findings += await asyncio.to_thread(_check_kubelet_gate, cfg, not blocked, pods_failed)
    findings += pods
    for level, text in findings:
        print("\n".join(columns.wrap(f"{level:5} {text}", CHECK_WIDTH, indent=" " * 6)))
    return EXIT_FAILURE if any(level == "error" for level, _ in findings) else EXIT_OK


NO_POD_SOURCE = ("error", "pods: no pod source answers: the service protects no pod until one does")


async def _check_pods(cfg: Config, sandbox: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The pod source as the service will see it: an answer, or an error with its fix and the
    consequence (without pods, the service protects no pod). What the service's sandbox hides
    from it (a podsFile under /tmp; a kubelet address its IPAddressAllow= leaves out: `sandbox`,
    unreachable_in_service's verdict) is said too. A kubelet the running service cannot reach is
    not asked from here: its answer to check would change nothing for the service."""
    if sandbox is not None and sandbox[0] == "error":
        return [("error", f"pods: {sandbox[1]}"), NO_POD_SOURCE]
    said = [(sandbox[0], f"pods: {sandbox[1]}")] if sandbox else []
    try:
        snap = await asyncio.to_thread(fetch, cfg)
    except SourceError as e:
        return said + [("error", f"pods: {e}"), NO_POD_SOURCE]
    hidden = hidden_from_service(cfg.pods_file) if cfg.pods_file else None
    if not hidden:
        return said + [("ok", f"pods: {snap.source} answered with {len(snap.pods)} pods")]
    return [("error", f"pods: {snap.source} answered {len(snap.pods)} pods here, but not in the service: {hidden}"),
            NO_POD_SOURCE]


# What owning every value beside the kubelet's own Memory QoS means (e2e 55-foreign-writer measures it).
FIGHT_KEPT = ("with companion: off, a kubelet with memoryReservationPolicy: TieredReservation writes kubepods.slice"
              " MemoryMin and kubepods-burstable.slice MemoryLow every minute and memqos-systemd puts its own back"
              " within about a second, each time counted in memqos_foreign_writes_total: protection dips every minute")


CONFIGZ_FIX = ("set kubeletConfigFile to the kubelet's config file, or let the service read its /configz (RBAC"
               " nodes/configz get, deploy/rbac/)")


def _check_kubelet_gate(cfg: Config, ask: bool = True, pods_failed: bool = False) -> list[tuple[str, str]]:
    """The kubelet's own Memory QoS and the mode it makes: who writes what, in one line (an error
    when nothing protects the pods, naming the two fixes); every value ours beside a kubelet that
    writes its own (error: the fight, the fix); what could not be read of the kubelet (warn: how to
    find out); its QOSReserved beside the BestEffort ceiling; and the fight as the service has seen it."""
    facts, reserved, answers = kubelet_gates(cfg, ask=ask, pods_failed=pods_failed)
    gate = facts.gate
    mode = companion_mode(cfg.companion, facts)
    level, line = who_writes_what(mode, cfg.memory_reservation_policy, cfg.memory_throttling_factor,
                                  adds(cfg, mode.writes))
    out = [(level, f"kubelet: {line}")]
    out += [("warn", f"kubelet: {w}") for w in facts.warnings]
    if cfg.companion == "on" and gate.on is False:
        out.append(("error", f"kubelet: its own Memory QoS is off ({gate.how}), yet companion: on leaves it what it would"
                             f" write with it on: nobody writes those; set companion: auto"))
    theirs = writes(facts) if gate.on else Writes()
    if not mode.companion and theirs:
        fought = theirs.protects or "MemoryHigh" in theirs.at("container")
        out.append(("error" if fought else "warn",
                    f"kubelet: its own Memory QoS is on ({gate.how}) and {mode.why}: the kubelet writes"
                    f" {properties_where(theirs.levels)} itself, and the service writes its own over them"
                    + (": two writers fight;" if fought else ";")
                    + f" fix: {GATE_FIX}" + (f"; {FIGHT_KEPT}" if theirs.protects else "")))
    if gate.on is None:
        out.append(("warn", f"kubelet: cannot tell whether its own Memory QoS is on ({gate.how}); it is on by default"
                            f" from v1.37, and the service then leaves what it writes to it if it can tell; set"
                            f" companion: on (or give it the kubelet's /metrics: RBAC nodes/metrics get)"))
    elif mode.companion and not facts.policy_said:
        out.append(("warn", f"kubelet: its memoryReservationPolicy is not known ({facts.policy_how}): taken as its"
                            f" default None, so the service writes the pods' protection; {CONFIGZ_FIX}"
                            + (f" ({answers.configz_why})" if answers.configz_why else "")))
    if mode.companion and not facts.policy_known:
        out.append(("warn", f"kubelet: its memoryReservationPolicy {facts.policy} ({facts.policy_how}) is not one this"
                            f" version knows ({', '.join(KNOWN_POLICIES)}): the pods' MemoryMin and MemoryLow are left"
                            f" to it, which then writes them as that policy says; plan and status show them as"
                            f" TieredReservation's"))
    # What each feature of the table has to say of the kubelet's settings (its QOSReserved beside the ceiling).
    wiring = wire(cfg, write=False, kubelet=mode.writes, state_dir=None)
    for feature in wiring.features:
        if hasattr(feature, "findings"):
            out += feature.findings(cfg, wiring.naming, reserved)
    # The fight as the service has seen it: by level and kind of writer (the units are in its
    # journal; a MemoryMax of the ceiling's written by another is said there, as it stood down),
    # and the units fought over now (fights.py).
    seen = _service_foreign_writes(cfg)
    if seen:
        each = [f"{level} level {n:g} time(s) {written_how([writer])}: {who_writes(level, writer, gate.on, reserved.on)}"
                for (level, writer), n in sorted(seen.items())]
        out.append(("warn", "writers: the service has put back values someone else wrote: " + "; ".join(each)
                            + " (memqos_foreign_writes_total; the units: journalctl -u memqos-systemd)"))
    resets = service_counts(cfg, "memqos_kubelet_resets_total", ("level", "moment"))
    if resets:
        out.append(("ok", "kubelet: its own moments the service put back (never a fight): " + "; ".join(
            f"{n:g} at {'its start' if moment == 'start' else 'a container creation or resize'} ({lv} level)"
            for (lv, moment), n in sorted(resets.items())) + " (memqos_kubelet_resets_total)"))
    for f in fights.current(FIGHTS_PATH, time.time()):
        who = " or ".join(who_writes(f["level"], w, gate.on, reserved.on) for w in sorted(f["writers"], reverse=True))
        out.append(("warn", f"writers: {f['unit']} is fought over: written behind the service's back {f['writes']}"
                            f" times ({written_how(f['writers'])}) by {who}; the service puts its values back each time"))
    return out


def _service_foreign_writes(cfg: Config) -> dict[tuple[str, str], float]:
    """memqos_foreign_writes_total of the running service, by (level, writer)."""
    return service_counts(cfg, "memqos_foreign_writes_total", ("level", "writer"))


