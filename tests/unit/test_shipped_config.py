"""The config file the package installs as /etc/memqos-systemd/config.yaml (etc/config.yaml).

It must never fall behind config.py: it parses, turns protection on, names every key the code
knows (nested ones too), and every "#key: value" line states the real built-in default, so
uncommenting the whole file changes nothing but the settings it sets on purpose.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml

from memqos_systemd import config
from memqos_systemd.config import (BurstableHighSettings, CeilingSettings, Config, KubeletSettings, LendingSettings,
                                   MetricsConfig, load_config, parse_config)


def _shipped() -> Path:
    # At build time pybuild runs the tests from a copy (debian/pybuild.testfiles copies etc/ next
    # to tests/); MEMQOS_SHIPPED_CONFIG points elsewhere if needed.
    env = os.environ.get("MEMQOS_SHIPPED_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "etc" / "config.yaml"


SHIPPED = _shipped()
# Keys whose default is "unset" and that cannot be written as null: the file shows an example.
EXAMPLE_ONLY = {"kubeReservedCgroup", "systemReservedCgroup"}
# Set on purpose in the shipped file (everything else is left at its default): protection on,
# and the pods from the kubelet's authenticated port as a kubeadm node serves it.
SET_ON_PURPOSE = {"memoryReservationPolicy": "TieredReservation"}
KUBELET_ON_PURPOSE = {"url": "https://127.0.0.1:10250/pods", "tokenFile": "/etc/memqos-systemd/kubelet-token",
                      "caFile": "/var/lib/kubelet/pki/kubelet.crt"}

_COMMENTED_TOP = re.compile(r"#([A-Za-z][A-Za-z0-9.]*):(\s.*)?$")
_COMMENTED_NESTED = re.compile(r"#(\s+)([A-Za-z][A-Za-z0-9.]*):(\s.*)?$")


def _text() -> str:
    return SHIPPED.read_text(encoding="utf-8")


def _uncommented(text: str) -> str:
    """The file with every "#key: value" setting (and the "#  sub: value" lines of its block,
    live or commented) live."""
    out, in_block = [], False
    for line in text.splitlines():
        if _COMMENTED_TOP.match(line):
            out.append(line[1:])
            in_block = True
        elif in_block and _COMMENTED_NESTED.match(line):
            out.append(line[1:])
        elif re.match(r"[A-Za-z][A-Za-z0-9.]*:\s*$", line):  # a live block such as "kubelet:"
            out.append(line)
            in_block = True
        else:
            out.append(line)
            in_block = in_block and line.startswith("  ")
    return "\n".join(out) + "\n"


def _builtin_but_on_purpose(cfg: Config) -> Config:
    """`cfg` with the settings the shipped file makes on purpose put back to the built-in defaults."""
    return dataclasses.replace(cfg, memory_reservation_policy="None", kubelet=KubeletSettings(
        **{f.name: getattr(cfg.kubelet, f.name) for f in dataclasses.fields(KubeletSettings)
           if _norm(f.name) not in {_norm(k) for k in KUBELET_ON_PURPOSE}}))


def _mentioned(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Top-level keys and, per block, nested keys written as settings (live or commented)."""
    doc = yaml.safe_load(_uncommented(text))
    top = set(doc)
    nested = {k: set(v) for k, v in doc.items()
              if isinstance(v, dict) and k in ("kubelet", "metrics", "bestEffortCeiling", "burstableHigh", "lending")}
    return top, nested


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def test_shipped_file_parses_with_the_loader_and_turns_on_tiered_reservation():
    cfg = load_config(SHIPPED, required=True)
    assert cfg.memory_reservation_policy == "TieredReservation"


def test_everything_else_is_left_at_the_builtin_default():
    cfg = load_config(SHIPPED, required=True)
    assert _builtin_but_on_purpose(cfg) == Config()


def test_asks_the_kubelets_authenticated_port_with_the_documented_token_and_ca():
    doc = yaml.safe_load(_text())
    assert doc["kubelet"] == KUBELET_ON_PURPOSE
    kubelet = load_config(SHIPPED, required=True).kubelet
    assert kubelet.server_name is None and kubelet.insecure_skip_tls_verify is False
    assert "mode 0600" in _text() and "serverTLSBootstrap" in _text()


def test_says_in_one_line_how_to_go_back_to_throttling_only():
    lines = [line for line in _text().splitlines() if "memoryReservationPolicy: None" in line]
    assert lines and any("throttling only" in line for line in lines)


def test_names_every_top_level_key_config_py_knows():
    top, _ = _mentioned(_text())
    known = set(config.describe_defaults())
    assert known - top == set(), "keys config.py knows that the shipped file does not show"
    assert top - known == set(), "keys in the shipped file that config.py does not know"


@pytest.mark.parametrize("block, record", [("kubelet", KubeletSettings), ("metrics", MetricsConfig),
                                           ("bestEffortCeiling", CeilingSettings),
                                           ("burstableHigh", BurstableHighSettings),
                                           ("lending", LendingSettings)])
def test_names_every_nested_key_config_py_knows(block, record):
    _, nested = _mentioned(_text())
    fields = {_norm(f.name) for f in dataclasses.fields(record)}
    shown = {_norm(k) for k in nested[block]}
    assert fields == shown


def test_every_commented_default_is_the_real_default():
    """Uncomment the whole file: only the settings set on purpose and the examples differ."""
    live = yaml.safe_load(_uncommented(_text()))
    for key in EXAMPLE_ONLY:
        live.pop(key)
    cfg = parse_config(live, str(SHIPPED))
    for key, attr_value in SET_ON_PURPOSE.items():
        assert live[key] == attr_value
    assert _builtin_but_on_purpose(cfg) == Config()
    # Every planner key now comes from the file, i.e. the file really wrote each one down.
    assert {k for k, v in cfg.origins.items() if v != "config"} == EXAMPLE_ONLY


def test_example_only_keys_show_a_valid_example():
    live = yaml.safe_load(_uncommented(_text()))
    example = {k: live[k] for k in EXAMPLE_ONLY}
    cfg = parse_config(example, str(SHIPPED))
    assert cfg.kube_reserved_cgroup and cfg.system_reserved_cgroup
    assert "Default: unset" in _text()


def test_every_setting_is_explained_next_to_it():
    """Each top-level setting has a comment paragraph right above it that names it."""
    lines = _text().splitlines()
    for i, line in enumerate(lines):
        m = _COMMENTED_TOP.match(line) or re.match(r"([A-Za-z][A-Za-z0-9.]*):", line)
        if not m:
            continue
        key = m.group(1)
        j = i - 1
        para = []
        while j >= 0 and lines[j].startswith("#"):
            para.append(lines[j])
            j -= 1
        assert any(key in p for p in para if p.startswith("# ")), f"{key}: no explanation above it"
