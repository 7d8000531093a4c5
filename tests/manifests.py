"""Render deploy/'s kustomizations as `kubectl apply -k` would, for the tests to read.

Only what our kustomizations use, and an error for anything else (so a new feature in them
cannot be silently mis-rendered): `resources` (files and kustomization directories), and
`patches` that are either JSON 6902 operations (applied with Debian's python3-jsonpatch, the
same RFC 6902 kustomize implements) on the objects their `target` names, or a strategic-merge
patch that is only `$patch: delete` (the object is dropped).
"""

from __future__ import annotations

from pathlib import Path

import yaml

KNOWN = {"apiVersion", "kind", "resources", "patches"}


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _key(obj: dict) -> tuple[str, str, str | None]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def _matches(obj: dict, target: dict) -> bool:
    unknown = set(target) - {"kind", "name", "namespace"}
    if unknown:
        raise NotImplementedError(f"patch target fields {sorted(unknown)}")
    kind, name, namespace = _key(obj)
    return (target.get("kind", kind) == kind and target.get("name", name) == name
            and target.get("namespace", namespace) == namespace)


def render(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize DIRECTORY` prints, in resource order."""
    import jsonpatch

    directory = Path(directory)
    docs = load(directory / "kustomization.yaml")
    assert len(docs) == 1, f"{directory}/kustomization.yaml: one document"
    k = docs[0]
    assert k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1" and k.get("kind") == "Kustomization", k
    if set(k) - KNOWN:
        raise NotImplementedError(f"{directory}/kustomization.yaml: {sorted(set(k) - KNOWN)}")
    objects: list[dict] = []
    for resource in k.get("resources", []):
        path = (directory / resource).resolve()
        objects += render(path) if path.is_dir() else load(path)
    keys = [_key(o) for o in objects]
    assert len(keys) == len(set(keys)), f"{directory}: an object twice: {keys}"
    for p in k.get("patches", []):
        if set(p) - {"patch", "target"}:
            raise NotImplementedError(f"{directory}: patch fields {sorted(set(p) - {'patch', 'target'})}")
        body = yaml.safe_load(p["patch"])
        if isinstance(body, list):  # JSON 6902
            hits = [i for i, o in enumerate(objects) if _matches(o, p["target"])]
            assert hits, f"{directory}: patch target {p['target']} matches nothing"
            for i in hits:
                objects[i] = jsonpatch.JsonPatch(body).apply(objects[i])
        elif isinstance(body, dict) and body.get("$patch") == "delete":
            target = {k2: v for k2, v in (("kind", body["kind"]), ("name", body["metadata"]["name"]),
                                          ("namespace", body["metadata"].get("namespace"))) if v}
            before = len(objects)
            objects = [o for o in objects if not _matches(o, target)]
            assert len(objects) == before - 1, f"{directory}: $patch: delete of {target} matches nothing"
        else:
            raise NotImplementedError(f"{directory}: strategic-merge patches other than $patch: delete")
    return objects


def by_key(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}
