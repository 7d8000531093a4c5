"""MEMQOS_E2E_SCENARIOS=smoke,harness (substrings) narrows a run like `-k`: the other scenarios are
deselected (pytest says so in its summary), neither booted nor reported as failed."""
import os
import re


def pytest_collection_modifyitems(config, items):
    env = os.environ.get("MEMQOS_E2E_SCENARIOS")
    if not env:
        return
    wanted = [w for w in re.split(r"[,\s]+", env) if w]
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        scenario = params.get("scenario")
        (drop if scenario is not None and not any(w in scenario for w in wanted) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
