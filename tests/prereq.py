"""Missing prerequisites: skipped on a developer's machine, a loud failure in CI.

CI (CI=true) runs every test; a test that cannot run there is a broken CI machine, not a
reason to pass quietly.
"""

import os

import pytest


def require(ok: object, reason: str) -> None:
    """Skip (or, under CI=true, fail) the calling test unless `ok`."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"prerequisite missing in CI: {reason}")
    pytest.skip(reason)
