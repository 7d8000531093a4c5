"""The commands that talk to systemd: apply, run, status, reset, check.

Each takes the parsed arguments and the loaded config and returns an exit
status (0 ok, 1 runtime failure). Bad input raises and `cli` turns it into 2.
`status` and `check` have modules of their own (cmd_status.py, cmd_check.py); every command builds
its wiring in one place (wiring.py) and names no feature.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from . import features, ledger
from .applier import Applier, ApplyResult, summarize
from .cmd_check import check
from .cmd_common import (CALL_TIMEOUT, EXIT_FAILURE, EXIT_OK, SERVICE, connect, err, fetch, left_to_it, mode_of,
                         not_a_node as not_a_node_, warn)
from .cmd_status import status
from .config import DEFAULT_CONFIG_PATH, Config, config_present
from .daemon import Daemon, Outside
from .intake import PodIntake
from .kubelet_gate import GATE_FIX
from .metrics import Metrics
from .node import MemoryWatcher, check_node, page_size, read_meminfo
from .notify import setup_logging
from .observe import Observer
from .plan import NodeFacts
from .reconcile import DEFAULTS, reset_plan
from .round import Inputs, Round
from .runfile import RunLockHeld, hold_run_lock
from .sources import SourceError, make_source
from .systemd import Systemd, SystemdError
from .places import CGROUP_ROOT, FIGHTS_PATH, LAST_PODS_PATH, LEDGER_PATH, RUN_LOCK_PATH, STATE_DIR
from .wiring import Wiring, wire

__all__ = ["apply", "reset", "status", "check", "run", "EXIT_OK", "EXIT_FAILURE", "CALL_TIMEOUT",
           "DEFAULT_CONFIG_PATH", "CGROUP_ROOT"]

# `run` where another daemon runs: not restarted by the unit (RestartPreventExitStatus=2, as for a
# bad config): a restart cannot help until that one stops.
EXIT_NOT_HERE = 2


# ------------------------------------------------------------------ apply
def apply(args, cfg: Config) -> int:
    return asyncio.run(_apply(cfg, dry_run=args.dry_run))


async def _apply(cfg: Config, *, dry_run: bool) -> int:
    """The round the service runs (round.py), once: the same intake, plan, diff and apply."""

    # On a machine that is no systemd/cgroup v2 node, that is the first thing to say (not, say,
    # that the kubelet is unreachable): nothing here could be applied.
    not_a_node = not_a_node_()
    if not_a_node:
        err(f"this machine is no systemd/cgroup v2 node: {'; '.join(not_a_node)}; nothing changed")
        return EXIT_FAILURE
    try:
        snapshot = await asyncio.to_thread(fetch, cfg)
    except SourceError as e:
        err(f"{e}; nothing changed")
        return EXIT_FAILURE
    for w in snapshot.warnings:
        warn(w)
    mode = await mode_of(cfg)
    if mode.companion:
        warn(left_to_it(mode))
    # The service's own intake: the pods of its last snapshot stand in for the previous one, so a
    # pod the source leaves out keeps its protection while its slice runs, as it does in `run`.
    intake = PodIntake(LAST_PODS_PATH, write=False)
    intake.recall()

    async def one_round(systemd, observer: Observer, applier: Applier) -> tuple[list, ApplyResult]:
        # Reserved slices the service wrote and the config no longer names go back to the
        # defaults, as the service's first round does (ledger.py; read, not written, here).
        retired = frozenset(ledger.read(LEDGER_PATH) - set(observer.naming.reserved_slices()))
        # Every unit of ours systemd has, and those: carry-over asks which pod slices run.
        applier.after_read(await observer.refresh_all(retired))
        for p in intake.accept(snapshot, observer.live_pod_uids()):
            warn(f"pod {p.display} is not listed by the pod source but its slice still exists; keeping its protection")
        if intake.holding is not None:
            warn("the pod source lists no pods but pod slices exist; not lowering anything")
        inputs = Inputs(intake.pods, NodeFacts(read_meminfo(), wiring.page_size, mode.writes), cfg, observer.naming,
                        intake.holding, retired)
        rnd = Round(features=wiring.features)
        desired = rnd.plan(inputs)
        for w in desired.warnings:
            warn(w)
        held = observer.snapshot().held
        waiting = [u.unit for u in desired.units if u.level in ("node", "qos") and held.get(u.unit) is None
                   and u.properties() != DEFAULTS]
        if waiting:
            warn(f"not loaded yet, left for the kubelet to create (the daemon sets them when it does):"
                  f" {', '.join(waiting)}")
        outcome = await rnd.run(inputs, observer, applier, dry_run=dry_run, echo=print)
        for w in wiring.warnings():
            warn(w)
        return outcome.changes, outcome.result

    # The features as the service runs them (a feature's files written before its value goes out);
    # a dry run reads their files (what a feature turned off takes back is shown) and writes nothing.
    wiring = wire(cfg, write=not dry_run, kubelet=mode.writes)
    return await _send(wiring, one_round, dry_run=dry_run, label="")


# ------------------------------------------------------------------ reset
def reset(args, cfg: Config) -> int:
    return asyncio.run(_reset(cfg, dry_run=args.dry_run))


async def _reset(cfg: Config, *, dry_run: bool) -> int:
    # Beside the kubelet's own Memory QoS, what it wrote is its own: a pod's it writes only once,
    # at the pod's creation, so taking it back would leave the pod unprotected for good.
    mode = await mode_of(cfg)
    # The features' own properties (a MemoryMax on the slices of a feature's ledger) are taken back too.
    wiring = wire(cfg, write=not dry_run, kubelet=mode.writes)

    async def changes(systemd, observer: Observer, applier: Applier) -> tuple[list, ApplyResult]:
        if await systemd.unit_state(SERVICE) in ("active", "activating", "reloading"):
            warn(f"{SERVICE} is running and will re-apply its plan; stop it first: systemctl disable --now {SERVICE}")
        # Also the reserved slices the service wrote that the config no longer names (ledger.py).
        former = ledger.read(LEDGER_PATH) - set(observer.naming.reserved_slices())
        applier.after_read(await observer.refresh_all(former))
        snap = observer.snapshot()
        found = reset_plan(snap.held, observer.naming, also=former, max_units=wiring.owned("MemoryMax"),
                           keep=mode.writes.at)
        return found, await applier.apply(found, snap, dry_run=dry_run, echo=print)

    if mode.companion:
        warn(left_to_it(mode))
    status = await _send(wiring, changes, dry_run=dry_run, label="reset: ")
    if status == EXIT_OK and not dry_run:
        features.taken_back(wiring.features)  # back to the defaults: nothing of ours is left
    return status


def _restored(unit: str, error: str | None) -> None:
    if error is not None:
        warn(f"cannot put memory.oom.group of {unit} back to the runtime's 1 after the write: {error}")


async def _send(wiring: Wiring, act, *, dry_run: bool, label: str) -> int:
    """Connect, and let `act` compute the changes against what systemd holds and send them (or
    print them): (changes, result), with the observer and the applier of `wiring`."""
    try:
        systemd = await connect()
    except SystemdError as e:
        err(f"cannot reach systemd: {e}; nothing changed")
        return EXIT_FAILURE
    try:
        changes, result = await act(systemd, wiring.observer(systemd), wiring.applier(systemd, _restored))
    except SystemdError as e:
        err(f"systemd: {e}")
        return EXIT_FAILURE
    finally:
        await systemd.close()
    if dry_run:
        print(f"dry run: {len(changes)} call(s) would be made; nothing changed", file=sys.stderr)
        return EXIT_OK
    if not result.ok:
        err(f"{label}{summarize(result)}")
        return EXIT_FAILURE
    print(f"{label}{summarize(result)}", file=sys.stderr)
    return EXIT_OK



# ------------------------------------------------------------------ run
def run(args, cfg: Config) -> int:
    log = setup_logging()

    for f in check_node(systemd=None):
        if f.level == "error":
            log.error("preflight: %s: %s", f.what, f.detail)
            return EXIT_FAILURE
        if f.level == "warn":
            log.warning("preflight: %s: %s", f.what, f.detail)
    try:
        run_lock = hold_run_lock(RUN_LOCK_PATH)  # held until this function returns
    except RunLockHeld as e:
        log.error("another memqos-systemd runs on this node (%s; %s): run the service or the DaemonSet, never"
                  " both (/usr/share/doc/memqos-systemd/DEPLOY.md)", e, RUN_LOCK_PATH)
        return EXIT_NOT_HERE
    except OSError as e:
        run_lock = None
        log.warning("cannot take %s: %s; another daemon on this node would go unnoticed", RUN_LOCK_PATH,
                    e.strerror or e)
    metrics = _metrics(cfg, log)
    outside = Outside(connect=lambda address: Systemd.connect(address, call_timeout=CALL_TIMEOUT),
                      make_source=make_source, read_capacity=read_meminfo, page_size=page_size(),
                      metrics=metrics, memory_watcher=_memory_watcher(log), ledger_path=LEDGER_PATH,
                      state_dir=STATE_DIR, last_pods_path=LAST_PODS_PATH, fights_path=FIGHTS_PATH)
    for note in cfg.notes:
        log.warning("config: %s", note)
    if cfg.kubelet_memory_qos_gate and cfg.companion == "off":
        log.warning("the kubelet's own Memory QoS is on (featureGates in %s) and companion: off: what it writes"
                    " itself the service writes again; %s", cfg.kubelet_config_file, GATE_FIX)
    config_path = getattr(args, "config", None)
    config_path = _default_config_path() if config_path is None else config_path
    try:
        return asyncio.run(Daemon(config_path, cfg, outside).run())
    finally:
        if run_lock is not None:
            run_lock.close()


def _default_config_path() -> str | None:
    return DEFAULT_CONFIG_PATH if config_present(DEFAULT_CONFIG_PATH) else None


def _metrics(cfg: Config, log) -> Any:
    metrics = Metrics()
    if cfg.metrics.listen:
        try:
            metrics.serve(cfg.metrics.listen)
            log.info("metrics on http://%s/metrics", cfg.metrics.listen)
        except OSError as e:
            log.error("metrics: cannot listen on %s: %s (continuing without)", cfg.metrics.listen, e)
    return metrics


def _memory_watcher(log) -> Any:
    try:
        return MemoryWatcher()
    except Exception as e:  # no udev in a container, no netlink permission, ...
        log.warning("memory hotplug: cannot watch udev (%s); capacity is re-read on the resync timer", e)
        return None
