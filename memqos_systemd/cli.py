"""Command line: parse, call, print. Exit 0 ok, 1 runtime failure, 2 bad input."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import sys
from typing import Any, Sequence

from . import __version__, columns, features
from .documents import DocumentError, decode
from .kubelet_gate import companion_mode, kubelet_facts
from .config import DEFAULT_CONFIG_PATH, Config, ConfigError, config_present, load_config, shown_path
from .plan import MAX_PAGE_SIZE, NodeFacts, PlanError, plan
from .plan_view import TableContext, plan_to_json, plan_to_table
from .pods import PodsError, count_finished, parse_pods
from .quantity import NOT_A_QUANTITY, QuantityError, parse_whole_bytes, shown

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
MAX_PODS_INPUT = 64 << 20

DESCRIPTION = """\
Give Kubernetes pods and node daemons real memory protection and throttling on
cgroup v2 (Memory QoS, KEP-2570, and Node Allocatable) by setting MemoryMin,
MemoryLow and MemoryHigh on kubepods.slice, the QoS and pod slices, container
scopes and the reserved slices through systemd's D-Bus API.

Start with a dry look, then apply:
  memqos-systemd plan --pods pods.json --config /etc/memqos-systemd/config.yaml
  memqos-systemd check
  memqos-systemd apply --once --dry-run
  memqos-systemd apply --once
  systemctl enable --now memqos-systemd      # the service runs `memqos-systemd run`
  memqos-systemd status
Roll back with `systemctl disable --now memqos-systemd && memqos-systemd reset`
(MemoryMin/MemoryLow 0, MemoryHigh infinity on every unit it manages).

Exit status: 0 success, 1 runtime failure (systemd or the kubelet unreachable, ...),
2 bad input (config, pods, arguments)."""


class UsageError(Exception):
    """Bad input from the command line or a file it names (exit 2)."""


class OutputError(Exception):
    """Standard output cannot be written (closed, disk full, ...): one line, exit 1."""


class _Stdout:
    """Standard output as the commands see it: the one place where a failed write (`> /dev/full`,
    `>&-`) becomes OutputError, which main() reports in one line. A closed pipe (`| head`) stays
    BrokenPipeError: the reader has all it wanted."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._do("write", text)

    def flush(self) -> None:
        if self._stream is not None:
            self._do("flush")

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def _do(self, what: str, *args):
        if self._stream is None:
            raise OutputError("standard output is closed")
        try:
            return getattr(self._stream, what)(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputError(e.strerror or str(e)) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _tolerant(stream):
    """A text stream that writes what its encoding cannot hold (a pod name under LANG=C or
    PYTHONIOENCODING=ascii) as backslash escapes instead of raising."""
    if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # already written to in another mode: leave it
            pass
    return stream


def _silence_stdout() -> None:
    """After a failed write, what is still buffered must not fail again at exit ("Exception
    ignored ..."): the descriptor goes to /dev/null."""
    _silence(sys.__stdout__)


def _silence(stream) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass


def _flush_stderr() -> None:
    """Standard error that cannot be written (`2>/dev/full`, `2>&-`) loses the message, never
    the exit status: a failed flush, now or at exit, would turn a 2 into 1 or 120."""
    try:
        sys.stderr.flush()
    except (OSError, AttributeError, ValueError):
        _silence(sys.__stderr__)


def _say(line: str) -> None:
    """One line on standard error (an error, a warning), whether or not it can be written."""
    try:
        print(line, file=sys.stderr)
    except (OSError, AttributeError, ValueError):
        pass
    _flush_stderr()


def _read_pods(arg: str) -> Any:
    try:
        if arg == "-":
            if sys.stdin is None:  # `<&-`
                raise UsageError("--pods -: standard input is closed (pipe the pods in, or name a file)")
            data = sys.stdin.buffer.read(MAX_PODS_INPUT + 1)
            where = "standard input"
        else:
            with open(arg, "rb") as f:
                data = f.read(MAX_PODS_INPUT + 1)
            where = arg
    except OSError as e:
        raise UsageError(f"--pods {arg}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_PODS_INPUT:
        raise UsageError(f"--pods {where}: larger than {MAX_PODS_INPUT >> 20} MiB")
    if arg == "-" and not data.strip():
        raise UsageError("--pods -: nothing on standard input (when a command pipes it in, did that command fail?"
                         " it says why on its own standard error)")
    try:
        return decode(data)
    except DocumentError as e:
        raise UsageError(f"--pods {where}: {e}") from None


def _node_memory(arg: str | None) -> int:
    if arg is None:
        from .node import read_meminfo

        try:
            return read_meminfo()
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read node memory from /proc/meminfo ({e}); pass --node-memory") from None
    if arg.startswith("-"):
        raise UsageError(f"--node-memory: {shown(arg)} must be a positive memory quantity (e.g. 16Gi)")
    try:
        value = parse_whole_bytes(arg)
    except QuantityError as e:
        problem = "is not a memory quantity" if e.problem == NOT_A_QUANTITY else e.problem
        raise UsageError(f"--node-memory: {shown(arg)} {problem}: give the node's memory (e.g. 16Gi)") from None
    if value <= 0:
        raise UsageError(f"--node-memory: {shown(arg)} must be positive")
    return value


def _page_size(arg: str | None) -> int:
    if arg is None:
        return os.sysconf("SC_PAGE_SIZE")
    try:
        value = int(arg)
    except ValueError:
        raise UsageError(f"--page-size: {shown(arg)} is not a whole number of bytes") from None
    if value <= 0 or value & (value - 1) or value > MAX_PAGE_SIZE:
        raise UsageError(f"--page-size: {arg} must be a power of two up to {MAX_PAGE_SIZE} (e.g. 4096)")
    return value


def _config(arg: str | None, *, default_path: bool) -> Config:
    if arg is None:
        cfg = load_config(DEFAULT_CONFIG_PATH if default_path else None, blocks=features.config_blocks())
    else:
        cfg = load_config(arg, required=True, blocks=features.config_blocks())
    _check_names(cfg, _config_name(arg, default_path=default_path))
    return cfg


def _config_name(arg: str | None, *, default_path: bool = True) -> str:
    """How messages name the config a command read (`--config ''` is named as given, not taken
    for the default)."""
    if arg is not None:
        return shown_path(arg)
    return DEFAULT_CONFIG_PATH if default_path else "defaults"


def _check_names(cfg: Config, src: str) -> None:
    """The unit names the config implies must be ours before any command runs: a reserved
    cgroup that is kubepods.slice (or one of its ancestors or children) is bad input (exit 2
    naming the key), not a traceback once systemd has been reached."""
    from .naming import Naming, NamingError

    try:
        Naming(cfg.cgroup_root)
    except NamingError as e:
        raise UsageError(f"{src}: {e}") from None
    for key, path, _ in cfg.enforced_reservations():
        try:
            Naming(cfg.cgroup_root, (path,))
        except NamingError as e:
            raise UsageError(f"{src}: {key}: {path!r}: {e}") from None


# The kubelet `plan` takes a kubeletConfigFile's for (it asks no kubelet): the release this one is
# built against (docs/DESIGN.md, "hierarchy: kubelet is the kubelet of v1.37").
PLAN_KUBELET = "v1.37"


def _plan_config(arg: str | None) -> tuple[Config, str | None, str]:
    """`plan`'s config, its file (None: built-in defaults) and how the table names it: --config,
    else the installed config when it exists (what the service and every other command read),
    else the built-in defaults, said loudly."""
    if arg is not None:
        return _config(arg, default_path=False), arg, shown_path(arg)
    if config_present(DEFAULT_CONFIG_PATH):
        return (_config(None, default_path=True), DEFAULT_CONFIG_PATH,
                f"{DEFAULT_CONFIG_PATH} (the installed config; --config for another)")
    return (_config(None, default_path=False), None,
            f"NONE: built-in defaults, which protect nothing (no {DEFAULT_CONFIG_PATH}; pass --config)")


def cmd_plan(args: argparse.Namespace) -> int:
    cfg, cfg_file, cfg_source = _plan_config(args.config)
    doc = _read_pods(args.pods)
    try:
        pods, pod_warnings = parse_pods(doc)
    except PodsError as e:
        raise UsageError(f"--pods {args.pods}: {e}") from None
    # Beside the kubelet's own Memory QoS as the config tells it (companion: on, or auto with a
    # kubeletConfigFile that turns its gate on, its policy and factor from that file or its
    # defaults); the kubelet itself is not asked here.
    # A kubelet config file means a kubelet: its version is taken as the one this release knows.
    mode = companion_mode(cfg.companion, kubelet_facts(file=cfg.kubelet_file, unasked="not asked: plan reads files only",
                                                       version=PLAN_KUBELET if cfg.kubelet_file else None))
    node = NodeFacts(capacity=_node_memory(args.node_memory), page_size=_page_size(args.page_size),
                     kubelet=mode.writes)
    made = features.offline(node.page_size)
    try:
        result = features.plan_all(pods, node, cfg, made)
    except PlanError as e:
        raise UsageError(f"{'built-in defaults' if cfg_file is None else shown_path(cfg_file)}: {e}") from None
    result = dataclasses.replace(result, warnings=cfg.notes + tuple(pod_warnings) + result.warnings)
    pending = {pod.key: pod.resize_pending for pod in pods if pod.resize_pending}
    output = args.output or ("table" if sys.stdout.isatty() else "json")
    if output == "json":
        json.dump(plan_to_json(result, pending, mode, shown_by=made), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        context = TableContext(cfg_source, "--node-memory" if args.node_memory else "MemTotal of /proc/meminfo",
                               count_finished(doc), mode)
        print(plan_to_table(result, cfg, pending, context=context, wide=output == "wide",
                            encoding=getattr(sys.stdout, "encoding", None), shown_by=made))
    return EXIT_OK


def _daemon_command(name: str):
    def run(args: argparse.Namespace) -> int:
        from . import commands

        try:
            return getattr(commands, name)(args, _config(args.config, default_path=True))
        except PlanError as e:  # e.g. reservations above the node's memory: the file that set them
            raise UsageError(f"{_config_name(args.config)}: {e}") from None
    return run


def cmd_reset(args: argparse.Namespace) -> int:
    """The rollback works with a broken config too: it then goes by the unit names it can find
    (config.unit_names_config) and the ledger of reserved slices, and says which config it
    could not read."""
    from . import commands
    from .config import unit_names_config

    try:
        cfg = _config(args.config, default_path=True)
    except (ConfigError, UsageError) as e:
        cfg = unit_names_config(DEFAULT_CONFIG_PATH if args.config is None else args.config)
        try:
            _check_names(cfg, "")
        except UsageError:
            cfg = Config()
        print(f"memqos-systemd: warning: config not used: {e}; resetting by the unit names found (cgroupRoot"
              f" {cfg.cgroup_root}) and the ledger of reserved slices", file=sys.stderr)
    return commands.reset(args, cfg)


HELP_WIDTH = 100  # as the tables: --help on a wide terminal stays readable, and the same everywhere


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The descriptions as written (each line under HELP_WIDTH), the options wrapped to the terminal
    but never wider than HELP_WIDTH."""

    def __init__(self, prog: str, **kwargs):
        kwargs.setdefault("width", min(HELP_WIDTH, shutil.get_terminal_size().columns - 2))
        super().__init__(prog, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memqos-systemd", description=DESCRIPTION, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = {}  # name -> its parser, for its own usage line (_parse)

    def add(name: str, help_: str, description: str) -> argparse.ArgumentParser:
        parser.commands[name] = sub.add_parser(name, help=help_, description=description,
                                               formatter_class=_HelpFormatter)
        return parser.commands[name]

    config_help = f"the config file (default: {DEFAULT_CONFIG_PATH} when it exists, else built-in defaults)"

    p = add("plan", "show the unit properties a node should hold; touches nothing",
            "Print the MemoryMin/MemoryLow/MemoryHigh every unit should hold for the given pods.\n"
            "Pure: reads the files named, never systemd or the kubelet.\n\n"
            "Without --config it reads the installed config (%s)\n"
            "when it exists, as every other command does; the table's header says which config it used.\n\n"
            "examples:\n"
            "  memqos-systemd plan --pods pods.json --output table\n"
            "  curl -fsS --cacert /var/lib/kubelet/pki/kubelet.crt --resolve \"$(hostname):10250:127.0.0.1\" \\\n"
            "    -H \"Authorization: Bearer $(cat /etc/memqos-systemd/kubelet-token)\" \\\n"
            "    \"https://$(hostname):10250/pods\" | memqos-systemd plan --pods -\n"
            "  (the kubelet's authenticated port, as the packaged config reads it;\n"
            "  /usr/share/doc/memqos-systemd/README.md, \"On a kubeadm node\"; -f: an answer other than 200,\n"
            "  such as 401 for a wrong token, is curl's error, not plan's input)"
            % DEFAULT_CONFIG_PATH)
    p.add_argument("--pods", required=True, metavar="PODS",
                   help="a PodList, a Pod, or a list of Pods as JSON or YAML (as the kubelet's /pods serves); - for stdin")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.add_argument("--node-memory", metavar="QTY", help="node memory capacity, e.g. 16Gi (default: MemTotal of /proc/meminfo)")
    p.add_argument("--page-size", metavar="BYTES", help="page size for MemoryHigh rounding (default: the OS page size)")
    p.add_argument("--output", choices=("json", "table", "wide"),
                   help="table for people (default on a terminal), wide (the table with every full unit name) or json")
    p.set_defaults(func=cmd_plan)

    p = add("apply", "reconcile once: send systemd what differs from the plan",
            "Fetch pods from the configured source, plan, compare with what systemd holds, and send only\n"
            "the differences (ancestors first when protection grows): SetUnitProperties for the reserved\n"
            "slices, SetProperties on the running unit (its invocation path) for the kubelet's units,\n"
            "which are never created by a write. On a machine that is no systemd/cgroup v2 node it says\n"
            "so and changes nothing.\n"
            "Exit status: 0 done, 1 no node, the pod source or systemd failed (nothing or part sent),\n"
            "2 bad config.")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.add_argument("--once", action="store_true", help="one reconcile, then exit (the only mode; kept for clarity)")
    p.add_argument("--dry-run", action="store_true", help="print the D-Bus calls it would make and change nothing")
    p.set_defaults(func=_daemon_command("apply"))

    p = add("run", "the service: keep units at their planned values, react to events",
            "Run as a daemon (systemd Type=notify): reconcile on pod changes, new units, kubelet restarts,\n"
            "memory hotplug, SIGHUP (reload config) and a periodic resync. SIGTERM exits and leaves\n"
            "protections in place. One daemon per node: where another runs (the service or the\n"
            "DaemonSet's pod; /run/memqos-systemd/run.lock names it), it exits 2.")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.set_defaults(func=_daemon_command("run"))

    p = add("status", "per pod: protection, usage, breaches, pressure; drift marked; holding",
            "Show the node's slices, then one line per pod (at most 100 columns; --output wide cuts no name):\n"
            "QoS class, request, protection (MIN/LOW: the plan's MemoryMin/MemoryLow), usage\n"
            "(memory.current), NOW/LENT, the kernel's count of `low` events (reclaimed below its memory.low:\n"
            "soft protection breached) and `oom_kill` since the pod's cgroup began, and PSI `full` avg10\n"
            "(memory.pressure); its containers by name under it. A unit whose plan, systemd's values and the\n"
            "kernel's memory.min/low/high disagree (DRIFT) is marked `!`, a reserved slice not yet created\n"
            "too.\n\n"
            "NOW: what the kernel protects of the pod now, as it computes it from every cgroup's usage and\n"
            "settings: its effective memory.min or memory.low, whichever is larger, up to its usage. LENT:\n"
            "the part of NOW that its own settings do not claim, lent by a parent's unclaimed protection\n"
            "(memory_recursiveprot); BestEffort pods can only be lent. The same per QoS class follows\n"
            "(\"protected now\": MIN/LOW NOW, PROTECTED, LENT).\n\n"
            "Last, the summary: the node's protection against allocatable, and whether the service holds\n"
            "(sends only raising values). --output json has every value, per unit and per pod.")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.add_argument("--output", choices=("json", "table", "wide"),
                   help="table for people (default on a terminal; names cut to fit 100 columns), wide (the table"
                        " with whole names) or json")
    p.set_defaults(func=_daemon_command("status"))

    p = add("reset", "set every managed property back to 0 / infinity (rollback)",
            "Set MemoryMin=0, MemoryLow=0, MemoryHigh=infinity on every unit we manage, through D-Bus,\n"
            "children before parents, and MemoryMax=infinity on every slice whose MemoryMax the\n"
            "service set: " + "; ".join(features.reset_notes()) + ".\n"
            "The rollback is:\n"
            "  systemctl disable --now memqos-systemd && memqos-systemd reset\n"
            "(a running service would re-apply its plan; a stopped but enabled one comes back at boot).\n"
            "A config that cannot be read does not stop it: a warning names it, and reset goes by the\n"
            "unit names it finds and the ledgers of the slices the service wrote (reserved slices:\n"
            "/run/memqos-systemd/reserved-slices).\n"
            "Exit status: 0 done, 1 systemd unreachable or a call refused.")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.add_argument("--dry-run", action="store_true", help="print the D-Bus calls it would make and change nothing")
    p.set_defaults(func=cmd_reset)

    p = add("check", "preflight: cgroup v2, memory controller, kernel, systemd, D-Bus, config",
            "Check that this node can run memqos-systemd and say what is wrong if not: systemd as PID 1\n"
            "and the system bus socket, systemd >= 240 reachable over D-Bus, cgroup v2 unified with the\n"
            "memory controller, memory_recursiveprot, kernel >= 5.9, the config, the kubelet's\n"
            "cgroupDriver (from its config file), who writes what beside the kubelet's own Memory QoS\n"
            "(its MemoryQoS gate, memoryReservationPolicy and memoryThrottlingFactor, from its /metrics,\n"
            "its /configz and its config file: an error when nothing protects the pods, or when the\n"
            "service writes over what the kubelet writes itself), and the pod source as the service\n"
            "will see it. A config that cannot be used stops it first (every other check needs it);\n"
            "after that every check runs, whatever an earlier one found.\n"
            "One line per finding (ok, warn, error). Exit status: 0 when nothing is an error (warnings\n"
            "allowed), 1 when something is (no pod source answering is one: the service would protect\n"
            "no pod), 2 when the config cannot be used (one line names the key and the value).")
    p.add_argument("--config", metavar="CONFIG", help=config_help)
    p.set_defaults(func=_daemon_command("check"))
    return parser


# Options whose value may start with "-" (a negative quantity is bad input to name, not argparse's
# "expected one argument").
_VALUE_OPTIONS = ("--node-memory", "--page-size")


def _join_values(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in _VALUE_OPTIONS and len(arg) > 1 and arg[0] == "-" and (arg[1].isdigit() or arg[1] == "."):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    # Standard error closed (`2>&-`): its messages are lost, not printed on standard output
    # (print(file=None) would), and the exit status stays what it is.
    sys.stderr = _tolerant(sys.stderr) if sys.stderr is not None else open(os.devnull, "w")
    saved = sys.stdout
    sys.stdout = _Stdout(_tolerant(saved) if saved is not None else None)
    try:
        try:
            args = _parse(build_parser(), _join_values(sys.argv[1:] if argv is None else argv))
            code = args.func(args)
            sys.stdout.flush()
            return code
        except (UsageError, ConfigError, PlanError) as e:
            _say(f"memqos-systemd: error: {e}")
            return EXIT_USAGE
        except OutputError as e:
            _silence_stdout()
            _say(f"memqos-systemd: error: cannot write the output: {e}")
            return EXIT_FAILURE
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_OK
    finally:
        sys.stdout = saved


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments. argparse prints --help and --version itself and exits at once: what it
    printed is flushed here, so that standard output closed or full (`> /dev/full`, `>&-`) is
    the same one-line error (OutputError) as for any command's output, never a traceback or a
    success that printed nothing. An argument the command does not know is said with that
    command's usage (argparse's own would print the top-level one), and a usage error exits 2
    whether or not standard error can be written."""
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            command = parser.commands.get(getattr(args, "command", None), parser)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return args
    except OSError:
        # Standard error full as argparse wrote its usage error (standard output is _Stdout's,
        # whose failures are OutputError).
        _silence(sys.__stderr__)
        raise SystemExit(EXIT_USAGE) from None
    except SystemExit as e:
        if e.code in (0, None):
            sys.stdout.flush()
        else:
            _flush_stderr()
        raise


if __name__ == "__main__":
    sys.exit(main())
