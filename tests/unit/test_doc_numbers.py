"""The numbers the shipped config, the man page, the README and DESIGN quote, read from the
code's constants (issue 20: etc/config.yaml said "every 10th resync" long after the code said 15).

Each quote is found by a pattern; a quote that is reworded so the pattern no longer finds it
fails here too, so the sentence and its test move together.
"""

from __future__ import annotations

import re
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from memqos_systemd import agenda
from memqos_systemd.config import Config


DEFAULT = Config()


def _find(rel: str) -> Path:
    # Each file from the nearest ancestor that has it: in pybuild's build directory etc/ is copied
    # next to tests/ (debian/pybuild.testfiles), the rest is found in the source tree above.
    for d in Path(__file__).resolve().parents:
        if (d / rel).is_file():
            return d / rel
    pytest.fail(f"{rel} not found above tests/")


def _text(rel: str) -> str:
    text = _find(rel).read_text(encoding="utf-8")
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


def test_readme_names_the_fast_targets_and_the_makefile_has_them():
    readme, makefile = _text("README.md"), _find("Makefile").read_text()
    for target in ("test-unit", "test-integration"):
        assert f"make {target}" in readme and f"\n{target}:" in makefile


def test_make_clean_says_how_to_drop_the_e2e_cache():
    p = subprocess.run(["make", "-s", "-n", "clean"], cwd=_find("Makefile").parent, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    assert "rm -rf /var/cache/memqos-e2e" in p.stdout


@pytest.mark.parametrize("where, pattern", [
    ("README.md", r"How many series: (\d+) a pod"),
    ("monitoring/README.md", r"A pod's (\d+):"),
    ("monitoring/README.md", r"\| default \(`metrics.perPod: true`\) \| (\d+) \|"),
    ("man/memqos-systemd.8", r"A pod costs (\d+) series"),
    ("etc/config.yaml", r"the per-pod series \((\d+) a pod"),
])
def test_series_a_pod_as_quoted(where, pattern):
    """The series a pod costs: one per key of each pod-level signal (signals.SIGNALS), and its
    protection's min and low."""
    from memqos_systemd.signals import SIGNALS

    per_pod = sum(len(s.keys) for s in SIGNALS if s.level == "pod") + 2
    for number in _all(pattern, _text(where), where):
        assert int(number) == per_pod, (where, pattern)


def test_readme_and_the_makefile_quote_one_size_for_the_e2e_guest_image():
    """Issue 33: README said 1.1 GB, the Makefile 750 MB (du -sh measured 1.1G)."""
    readme = re.findall(r"/var/cache/memqos-e2e` \(([\d.]+ [GM]B) on disk", _find("README.md").read_text(encoding="utf-8"))
    make = re.findall(r"guest images \(about ([\d.]+ [GM]B) on disk", _find("Makefile").read_text(encoding="utf-8"))
    assert readme and readme == make, (readme, make)


def test_readme_says_what_the_test_set_up_installs():
    """Issue 33: "Debian packages" only, while test-unit also pip-installed a PyPI package.
    Issue 41: nothing comes from PyPI (the project's machines cannot reach it); Go modules do."""
    text = " ".join(_find("README.md").read_text(encoding="utf-8").split())
    assert "nothing from PyPI" in text and "Go module proxy" in text
    make = _find("Makefile").read_text(encoding="utf-8") + _find("scripts/install-deps.sh").read_text(encoding="utf-8")
    assert "pip install" not in make.replace("pip install --quiet --no-deps --no-build-isolation --disable-pip-version-check -e .", "")
    assert "promtool" in text and "neither started nor enabled" in text


def test_benchmarks_md_counts_its_benchmarks():
    """Issue 33: "Three benchmarks" over four sections."""
    text = _find("docs/BENCHMARKS.md").read_text(encoding="utf-8")
    words = {"Two": 2, "Three": 3, "Four": 4, "Five": 5, "Six": 6}
    count = re.match(r"# Benchmarks\s+(\w+) benchmarks", text).group(1)
    assert words[count] == len(re.findall(r"^<!-- [\w-]+:start -->$", text, re.M)), count


def test_the_man_page_names_each_config_key_once_in_its_list():
    """Issue 33: resyncInterval twice in the list of the daemon's keys."""
    man = _find("man/memqos-systemd.8").read_text(encoding="utf-8")
    start = man.index("the daemon's keys are")
    listing = man[start:man.index("The installed file lists every key")]
    keys = re.findall(r"^\.B[R]? (\w+)", listing, re.M) + re.findall(r"^\.RB \( ?(\w+)", listing, re.M)
    assert keys and len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_readme_says_make_tests_cost_once_not_as_a_log():
    """Issue 43: the paragraph on make test's cost had grown into a log of past runs (five dates,
    three commits). One measurement, the latest, with its date and commit."""
    readme = _find("README.md").read_text(encoding="utf-8")
    start = readme.index("`make test` costs about")
    para = readme[start:readme.index("\n\n", start)]
    assert len(re.findall(r"\b20\d\d-\d\d-\d\d\b", para)) == 1, para
    assert len(re.findall(r"\b[0-9a-f]{7,40}\b", para)) == 1, para
