"""What the documents say agrees with the code (issue 26): --help, the man page, README,
deploy/ and debian/ against the parser, the metrics and the package."""

from __future__ import annotations

import re

from repo_docs import help_text, man_text


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
