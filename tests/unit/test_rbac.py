"""deploy/rbac/: the RBAC an operator applies once per cluster for the kubelet's /pods (issue 15).

Checked as Kubernetes objects: every file parses, each object has the kind, name and namespace
the README, the DaemonSet (deploy/kubernetes/) and the daemon's own error messages use, the role
grants exactly `get` on `nodes/pods`, `nodes/metrics` and `nodes/configz`, and the broader `nodes/proxy` fallback is a separate file
that the kustomization leaves out. (Schema validation against the API comes separately.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from memqos_systemd.sources import kubelet
from repo_docs import repo_file


def _rbac_dir() -> Path:
    for d in Path(__file__).resolve().parents:
        if (d / "deploy" / "rbac").is_dir():
            return d / "deploy" / "rbac"
    pytest.fail("deploy/rbac/ not found above tests/ (debian/pybuild.testfiles must copy deploy)")


RBAC = _rbac_dir()
NAMESPACE, ACCOUNT, ROLE, SECRET = "memqos-system", "memqos-systemd", "memqos-systemd-pod-reader", "memqos-systemd-token"
SUBJECT = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((RBAC / name).read_text(encoding="utf-8")) if d is not None]


def objects(name: str) -> list[dict]:
    """The Kubernetes objects of a manifest file, each checked for the fields every object has."""
    docs = documents(name)
    for d in docs:
        assert isinstance(d, dict) and {"apiVersion", "kind", "metadata"} <= set(d), (name, d)
        assert isinstance(d["metadata"].get("name"), str) and d["metadata"]["name"], (name, d)
    return docs


def kustomized() -> dict[tuple[str, str], dict]:
    k = documents("kustomization.yaml")
    assert [d["kind"] for d in k] == ["Kustomization"] and k[0]["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    out = {}
    for resource in k[0]["resources"]:
        assert (RBAC / resource).is_file(), resource
        for d in objects(resource):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def test_the_kustomization_makes_exactly_the_least_privilege_objects():
    objs = kustomized()
    assert set(objs) == {("Namespace", NAMESPACE), ("ServiceAccount", ACCOUNT), ("ClusterRole", ROLE),
                         ("ClusterRoleBinding", ROLE), ("Secret", SECRET)}
    assert "fallback-nodes-proxy.yaml" not in documents("kustomization.yaml")[0]["resources"]
    for (kind, _), d in objs.items():
        namespaced = kind in ("ServiceAccount", "Secret")
        assert d["metadata"].get("namespace") == (NAMESPACE if namespaced else None), kind
        assert d["apiVersion"] == ("rbac.authorization.k8s.io/v1" if kind.startswith("Cluster") else "v1"), kind


def test_the_role_grants_get_on_nodes_pods_metrics_and_configz_and_nothing_else():
    role = kustomized()[("ClusterRole", ROLE)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods", "nodes/metrics", "nodes/configz"],
                              "verbs": ["get"]}]


def test_the_binding_gives_the_role_to_the_service_account():
    binding = kustomized()[("ClusterRoleBinding", ROLE)]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE}
    assert binding["subjects"] == [SUBJECT]


def test_the_token_secret_is_a_long_lived_service_account_token():
    secret = kustomized()[("Secret", SECRET)]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": ACCOUNT}
    assert "data" not in secret and "stringData" not in secret  # the token controller fills it


def test_the_nodes_proxy_fallback_is_separate_and_says_why_it_grants_more():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in objects("fallback-nodes-proxy.yaml")}
    role = docs[("ClusterRole", "memqos-systemd-nodes-proxy")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    binding = docs[("ClusterRoleBinding", "memqos-systemd-nodes-proxy")]
    assert binding["roleRef"]["name"] == "memqos-systemd-nodes-proxy" and binding["subjects"] == [SUBJECT]
    header = (RBAC / "fallback-nodes-proxy.yaml").read_text(encoding="utf-8")
    assert "exec" in header and "v1.33" in header


def test_the_daemons_403_message_names_these_objects():
    # The fix a 403 prints (sources/kubelet.py) must point at what is really here.
    hint = kubelet._RBAC_HINT
    assert ROLE in hint and "nodes/pods" in hint and "deploy/rbac/" in hint
    assert "fallback-nodes-proxy.yaml" in hint and (RBAC / "fallback-nodes-proxy.yaml").is_file()
    assert f"{NAMESPACE}/{ACCOUNT}" in kubelet._TOKEN_HINT


def test_the_readme_names_every_subresource_the_role_grants():
    """issue 26: the README said the role grants nodes/pods only, while it grants nodes/metrics too."""
    granted = {r for rule in kustomized()[("ClusterRole", ROLE)]["rules"] for r in rule["resources"]}
    row = next(line for line in (RBAC / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `clusterrole.yaml` |"))
    assert set(re.findall(r"`(nodes/[a-z]+)`", row)) == granted, row


def test_the_package_ships_every_rbac_file_in_usr_share():
    """issue 26: `kubectl apply -k deploy/rbac/` needed the source; the .deb installs the directory
    in /usr/share/memqos-systemd/rbac/ (debian/memqos-systemd.install, dh_install's globs)."""
    install = repo_file("debian", "memqos-systemd.install")
    top = install.parent.parent
    shipped = set()
    for line in install.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            *sources, dest = line.split()
            if dest.rstrip("/") == "usr/share/memqos-systemd/rbac":
                shipped |= {p.name for s in sources for p in top.glob(s) if p.is_file()}
    assert shipped == {p.name for p in RBAC.iterdir() if p.is_file()}, shipped
    assert "kustomization.yaml" in shipped and "README.md" in shipped


def test_the_readme_gives_the_token_command_with_mode_0600():
    text = (RBAC / "README.md").read_text(encoding="utf-8")
    assert f"get secret {SECRET}" in text and "-n memqos-system" in text
    assert "install -m 0600 /dev/stdin /etc/memqos-systemd/kubelet-token" in text
