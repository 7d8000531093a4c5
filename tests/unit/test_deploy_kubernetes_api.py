"""deploy/'s manifests against the Kubernetes API itself, with no PyPI package (tests/kube_api.py).

Every object of both kustomizations, rendered as `kubectl apply -k` would (tests/manifests.py):
- validated strictly (an unknown field fails) against the OpenAPI v3 schemas of the oldest
  release the manifests support and of the newest, from the k8s.io/kubernetes Go module;
- decoded strictly and validated by the API server's own create-time validation of the newest
  (tests/go/kube/manifestcheck, built by scripts/build-go.sh).
A table of hostile changes shows what each check refuses, so none can quietly go lax.

These tests need the Go command and the Go module proxy (or its cache), which a Debian package
build must not: `make test` runs them in its venv, and debian/rules leaves this file out.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from prereq import require

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kube_api  # noqa: E402
import manifests  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
UNINSTALL = REPO / "deploy" / "kubernetes-uninstall"


@pytest.fixture(scope="module")
def objs():
    return manifests.by_key(manifests.render(DEPLOY))


def _kube_api(check, *args):
    """Run one of kube_api's checks; a Go command, proxy or build that fails is a missing
    prerequisite (a failure under CI=true), never a pass."""
    try:
        return check(*args)
    except kube_api.KubeAPIUnavailable as e:
        require(False, str(e))


def _named(obj: dict, problems: list[str]) -> list[str]:
    return [f"{obj['kind']}/{obj['metadata']['name']}: {p}" for p in problems]


@pytest.mark.parametrize("version", [kube_api.OLDEST, kube_api.NEWEST])
@pytest.mark.parametrize("directory", [DEPLOY, UNINSTALL], ids=["install", "uninstall"])
def test_every_object_is_valid_for_the_kubernetes_api_schema(version, directory):
    problems = [line for o in manifests.render(directory)
                for line in _named(o, _kube_api(kube_api.schema_problems, o, version))]
    assert problems == []


@pytest.mark.parametrize("directory", [DEPLOY, UNINSTALL], ids=["install", "uninstall"])
def test_every_object_passes_the_api_servers_own_validation(directory):
    assert _kube_api(kube_api.server_problems, manifests.render(directory)) == []


def _spec(o):
    return o["spec"]["template"]["spec"]


# What each check must refuse, on the DaemonSet as shipped: (change, refused by the OpenAPI
# schema of the oldest release, of the newest, by the API server of the newest).
HOSTILE = [
    ("an unknown field", lambda o: _spec(o)["containers"][0].update(bogus=1), True, True, True),
    ("a string for an integer", lambda o: _spec(o)["containers"][0]["ports"][0].update(containerPort="x"),
     True, True, True),
    ("a required field missing", lambda o: o["spec"].pop("selector"), True, True, True),
    ("a restartPolicy a DaemonSet may not have", lambda o: _spec(o).update(restartPolicy="Never"),
     False, False, True),
    ("a field newer than the oldest release (pod-level resources, 1.32)",
     lambda o: _spec(o).update(resources={"limits": {"memory": "1Gi"}}), True, False, False),
    ("a name the API refuses", lambda o: o["metadata"].update(name="Memqos_Systemd"), False, False, True),
    ("a selector that misses the template's labels",
     lambda o: o["spec"]["selector"]["matchLabels"].update(other="x"), False, False, True),
]


@pytest.mark.parametrize("what,change,oldest,newest,server", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_api_checks_refuse_what_the_api_refuses(objs, what, change, oldest, newest, server):
    ds = copy.deepcopy(objs[("DaemonSet", "memqos-systemd")])
    change(ds)
    assert bool(_kube_api(kube_api.schema_problems, ds, kube_api.OLDEST)) is oldest, what
    assert bool(_kube_api(kube_api.schema_problems, ds, kube_api.NEWEST)) is newest, what
    assert bool(_kube_api(kube_api.server_problems, [ds])) is server, what
