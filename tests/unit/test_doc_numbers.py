"""The numbers the shipped config, the man page, the README and DESIGN quote, read from the
code's constants (issue 20: etc/config.yaml said "every 10th resync" long after the code said 15).

Each quote is found by a pattern; a quote that is reworded so the pattern no longer finds it
fails here too, so the sentence and its test move together.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from memqos_systemd import agenda
from memqos_systemd.config import Config
from prereq import require


def _top() -> Path | None:
    # A checkout, or pybuild's build directory (which copies etc/ next to tests/, not docs/).
    for d in Path(__file__).resolve().parents:
        if (d / "etc" / "config.yaml").is_file():
            return d
    return None


TOP = _top()
DEFAULT = Config()


def _text(rel: str) -> str:
    if TOP is None or not (TOP / rel).is_file():
        require(False, f"{rel} not found above tests/")
    text = (TOP / rel).read_text()
    # the man page's escapes and fonts, and line breaks, out of the way
    return re.sub(r"\s+", " ", text.replace("\\-", "-").replace("\n.BR ", " ").replace("\n.B ", " "))


def _all(pattern: str, text: str, where: str) -> list[str]:
    found = re.findall(pattern, text)
    assert found, f"{where}: no quote matches {pattern!r} any more; reword the test with the text"
    return found


@pytest.mark.parametrize("where, pattern", [
    ("etc/config.yaml", r"every (\d+)th resync"),
    ("etc/config.yaml", r"within (\d+) resyncIntervals"),
    ("man/memqos-systemd.8", r"every (\d+)th time"),
    ("docs/DESIGN.md", r"every unit every (\d+)th time"),
])
def test_full_resync_cadence_as_quoted(where, pattern):
    for number in _all(pattern, _text(where), where):
        assert int(number) == agenda.FULL_RESYNC_EVERY, (where, pattern)


def test_full_resync_in_minutes_as_quoted():
    for minutes, interval in _all(r"\((\d+) min at (\d+)s\)", _text("etc/config.yaml"), "etc/config.yaml"):
        assert int(interval) == DEFAULT.resync_interval
        assert int(minutes) * 60 == agenda.FULL_RESYNC_EVERY * DEFAULT.resync_interval


def test_readme_defaults_as_quoted():
    readme = _text("README.md")
    for factor in _all(r"`memoryThrottlingFactor` \(default ([0-9.]+)\)", readme, "README.md"):
        assert float(factor) == DEFAULT.memory_throttling_factor
    for pct in _all(r"`protectionHeadroom` \(default (\d+)%\)", readme, "README.md"):
        assert Fraction(int(pct), 100) == DEFAULT.protection_headroom.fraction and DEFAULT.protection_headroom.bytes == 0
    for listen in _all(r"(127\.0\.0\.1:\d+)/metrics", readme, "README.md"):
        assert listen == DEFAULT.metrics.listen
    for policy in _all(r"built-in default is `(\w+)`", readme, "README.md"):
        assert policy == DEFAULT.memory_reservation_policy


def test_shipped_config_resync_default_as_quoted():
    for interval in _all(r"#resyncInterval: (\d+)s", _text("etc/config.yaml"), "etc/config.yaml"):
        assert int(interval) == DEFAULT.resync_interval
