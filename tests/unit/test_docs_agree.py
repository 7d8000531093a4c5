"""What the documents say agrees with the code (issue 26): --help, the man page, README,
deploy/ and debian/ against the parser, the metrics and the package."""

from __future__ import annotations

import re

import pytest

from repo_docs import help_text, man_text, repo_file


def _kubelet_curls(text: str) -> list[str]:
    """Every curl command (with its continuation lines) that reads the kubelet's /pods."""
    flat = text.replace("\\\n", " ")
    return [line for line in flat.splitlines() if "curl " in line and ":10250/pods" in line]


def test_every_curl_that_feeds_plan_fails_on_an_http_error():
    """Without -f, a 401's body reaches plan as its input ("expected a PodList ... got str")."""
    for where, text in (("plan --help", help_text("plan")), ("man page", man_text())):
        curls = _kubelet_curls(text)
        assert curls, where
        for line in curls:
            assert re.search(r"curl -[a-zA-Z]*f[a-zA-Z]*\b", line) and "-fsS" in line, (where, line)


def _output_choices(command: str) -> tuple[str, ...] | None:
    from memqos_systemd import cli

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[command]
    return next((tuple(a.choices) for a in sub._actions if "--output" in a.option_strings), None)


@pytest.mark.parametrize("command", ["plan", "status", "apply", "run", "reset", "check"])
def test_the_man_page_lists_every_output_a_command_takes(command):
    """issue 26: the man page's --output lacked wide."""
    choices = _output_choices(command)
    synopsis = man_text().split(".SH DESCRIPTION")[0]
    block = next(b for b in synopsis.split(".SY memqos-systemd")[1:] if b.split()[1] == command)
    if choices is None:
        assert "--output" not in block
        return
    ordered = sorted(choices, key=["json", "table", "wide"].index)
    assert f".OP --output {'|'.join(ordered)}" in block, block
    assert ".B --output " + "\\fR|\\fP".join(ordered) + "\n" in man_text()  # OPTIONS


def test_check_help_says_what_a_broken_config_does():
    """issue 26: 'Every check runs' while a config that cannot be used stops check first (exit 2)."""
    for text in (" ".join(help_text("check").split()), " ".join(man_text().split())):
        assert "A config that cannot be used stops it first" in text and "Every check runs" not in text


# The documents an operator reads for the metrics' meaning.
METRIC_DOCS = [("README.md",), ("docs", "DEPLOY.md"), ("docs", "runbook.md"), ("docs", "DESIGN.md"),
               ("docs", "RELIABILITY.md"), ("deploy", "kubernetes", "daemonset.yaml"), ("monitoring", "README.md"),
               ("monitoring", "alerts.yaml"), ("monitoring", "rules.yaml"), ("man", "memqos-systemd.8")]


def _results_the_code_sets() -> dict[str, set[str]]:
    """The `result` label values of the counters whose results are a closed set, as the code sets
    them (each outcome made to happen once)."""
    from memqos_systemd.metrics import Metrics

    m = Metrics()
    for ok in (True, False):
        m.oom_group_restored(ok)
        m.config_reload(ok)
    out: dict[str, set[str]] = {}
    for family in m.registry.collect():
        for sample in family.samples:
            if sample.name in ("memqos_oom_group_restores_total", "memqos_config_reloads_total"):
                out.setdefault(sample.name, set()).add(sample.labels["result"])
    return out


def test_documented_result_labels_are_the_ones_the_code_sets():
    """issue 26: docs/DEPLOY.md and daemonset.yaml said result="failed" where the code says "error"."""
    text = "\n".join(repo_file(*parts).read_text(encoding="utf-8") for parts in METRIC_DOCS)
    for name, values in _results_the_code_sets().items():
        documented = set(re.findall(rf'{name}\{{[^}}]*result="([^"]*)"', text))
        assert documented <= values, (name, documented - values)
    assert re.search(r'memqos_oom_group_restores_total\{result="error"\}', text)
