"""The packaged units' own protection (issue 25: the daemon survives the pressure it is there
for), as the files say it: the service in memqos.slice directly under the root slice, both
protected, the slice at least as much as the service (a protection is effective only up to the
parent's), an OOM score below every pod's but the kubelet's and Guaranteed pods', and the package
shipping the slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from memqos_systemd.quantity import parse_bytes


def _find(rel: str) -> Path:
    for d in Path(__file__).resolve().parents:
        if (d / rel).is_file():
            return d / rel
    pytest.fail(f"{rel} not found above tests/")


def _settings(rel: str) -> dict[str, dict[str, str]]:
    """{section: {key: value}} of a unit file (the last of a repeated key; comments skipped)."""
    out: dict[str, dict[str, str]] = {}
    section = None
    for line in _find(rel).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section[key.strip()] = value.strip()
    return out


SERVICE = _settings("units/memqos-systemd.service")
SLICE = _settings("units/memqos.slice")


def _bytes(value: str) -> int:
    # systemd's suffixes are base 1024 (K, M, G): the same as Ki, Mi, Gi
    return parse_bytes(value + "i" if value[-1:] in "KMG" else value)


def test_the_service_runs_in_its_own_slice_directly_under_the_root():
    assert SERVICE["Service"]["Slice"] == "memqos.slice"
    # a dash in a slice's name makes it a child of another slice: none, so -.slice is its parent
    assert "-" not in "memqos.slice"[: -len(".slice")]


@pytest.mark.parametrize("prop", ["MemoryMin", "MemoryLow"])
def test_the_slice_holds_at_least_what_the_service_holds(prop):
    service, slice_ = _bytes(SERVICE["Service"][prop]), _bytes(SLICE["Slice"][prop])
    assert 0 < service <= slice_


def test_memory_low_is_not_below_memory_min():
    for settings, section in ((SERVICE, "Service"), (SLICE, "Slice")):
        assert _bytes(settings[section]["MemoryLow"]) >= _bytes(settings[section]["MemoryMin"])


def test_the_oom_killer_takes_every_pod_but_a_guaranteed_one_before_the_daemon():
    adj = int(SERVICE["Service"]["OOMScoreAdjust"])
    # the kubelet gives Guaranteed and node-critical pods -997, itself -999; Burstable pods 2..999
    assert -997 < adj <= -900


def test_the_package_ships_the_slice_beside_the_service():
    installed = _find("debian/memqos-systemd.install").read_text(encoding="utf-8").split("\n")
    assert "units/memqos.slice lib/systemd/system/" in installed
    assert "units/memqos-systemd.service lib/systemd/system/" in installed


@pytest.mark.parametrize("doc", ["README.md", "docs/PACKAGING.md"])
def test_the_docs_quote_the_units_protection(doc):
    text = _find(doc).read_text(encoding="utf-8")
    assert f"MemoryMin={SERVICE['Service']['MemoryMin']}" in text
    assert f"OOMScoreAdjust={SERVICE['Service']['OOMScoreAdjust']}" in text
    assert "memqos.slice" in text


def test_check_judges_the_kubelet_url_by_the_packaged_sandbox():
    """check names a kubelet URL the service's sandbox blocks by the packaged unit's settings
    when the service does not run (sources.kubelet.PACKAGED_ACCESS): they must be the unit's."""
    from memqos_systemd.sources.kubelet import PACKAGED_ACCESS, PACKAGED_SETTINGS

    said = dict(kv.split("=", 1) for kv in PACKAGED_SETTINGS.split(", "))
    assert {k: SERVICE["Service"][k] for k in said} == said == {"IPAddressDeny": "any", "IPAddressAllow": "localhost"}
    localhost = [(bytes([127, 0, 0, 0]), 8), (bytes(15) + b"\x01", 128)]  # systemd's `localhost`
    assert PACKAGED_ACCESS == (localhost, [(bytes(4), 0), (bytes(16), 0)])  # and its `any`
