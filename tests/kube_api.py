"""The Kubernetes API that deploy/'s manifests are checked against, with no PyPI package.

Two checks, each from the k8s.io/kubernetes Go module at a pinned release (the Go module proxy):

- `schema_problems`: the release's own OpenAPI v3 documents (`api/openapi-spec/v3/` in the module),
  validated strictly with Debian's python3-jsonschema: every object schema refuses a property it
  does not name (as `kubectl --validate=strict` and kubernetes-validate's strict mode do), and
  types, enums and required fields are checked. Run for the oldest release the manifests support
  and for the newest.
- `server_problems`: the API server's own decoding (strict: unknown and duplicated fields) and
  create-time validation, built from the same release (tests/go/kube/manifestcheck).

Where the module lives comes from the `go` command (`go mod download -json`), and the validator
from scripts/build-go.sh; nothing depends on where this tree is.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

# The releases the manifests are checked against: the oldest supported (docs/DEPLOY.md) and the
# one the e2e suite's kubelet is (tests/go/kube/go.mod pins it).
OLDEST = "1.29.6"
NEWEST = "1.37.2"


class KubeAPIUnavailable(RuntimeError):
    """The Go command, the module proxy or a build failed: the message says which and how."""


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.access(go, os.X_OK):
        raise KubeAPIUnavailable("no go command (Go is at /usr/local/go on the project's machines)")
    return go


def module_dir(version: str) -> Path:
    """The k8s.io/kubernetes module at `version`, downloaded from the Go module proxy if needed."""
    proc = subprocess.run([_go(), "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
                          capture_output=True, text=True, env={**os.environ, "GOFLAGS": "-mod=mod"})
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise KubeAPIUnavailable(f"go mod download k8s.io/kubernetes@v{version} failed: "
                                 f"{info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


def _document_name(api_version: str) -> str:
    """`apps/v1` -> apis__apps__v1_openapi.json; `v1` -> api__v1_openapi.json."""
    group, _, version = api_version.rpartition("/")
    return f"apis__{group}__{version}_openapi.json" if group else f"api__{version}_openapi.json"


def _strict(node):
    """Every object schema that names its properties refuses the others, unless the API says
    it keeps unknown fields (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(node, dict):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


@functools.lru_cache(maxsize=None)
def _document(version: str, api_version: str) -> dict:
    path = module_dir(version) / "api" / "openapi-spec" / "v3" / _document_name(api_version)
    if not path.is_file():
        raise KubeAPIUnavailable(f"Kubernetes {version} has no API group version {api_version!r} ({path.name})")
    return _strict(json.loads(path.read_text(encoding="utf-8")))


def _schema_name(document: dict, api_version: str, kind: str) -> str | None:
    group, _, version = api_version.rpartition("/")
    for name, schema in document["components"]["schemas"].items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == (group, version, kind):
                return name
    return None


def _where(error) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(the object)"


def schema_problems(obj: dict, version: str) -> list[str]:
    """What the OpenAPI schema of Kubernetes `version` refuses in `obj`, one line each."""
    import jsonschema

    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    document = _document(version, api_version)
    name = _schema_name(document, api_version, kind)
    if name is None:
        return [f"{kind} is not a kind of {api_version} in Kubernetes {version}"]
    resolver = jsonschema.RefResolver(base_uri="", referrer=document)
    validator = jsonschema.Draft7Validator({"$ref": f"#/components/schemas/{name}"}, resolver=resolver)
    return sorted(f"{_where(e)}: {e.message}" for e in validator.iter_errors(copy.deepcopy(obj)))


def manifestcheck() -> str:
    """The API server's validation of v`NEWEST`, built (once, cached) by scripts/build-go.sh."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "build-go.sh"
    proc = subprocess.run([str(script), "manifestcheck"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise KubeAPIUnavailable(f"scripts/build-go.sh manifestcheck failed: {proc.stderr.strip()}")
    return proc.stdout.strip().splitlines()[-1]


def server_problems(objects: list[dict]) -> list[str]:
    """What the API server of v`NEWEST` refuses at create time, one line each ("KIND/NAME: ...")."""
    proc = subprocess.run([manifestcheck()], input=json.dumps(objects), capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise KubeAPIUnavailable(f"manifestcheck failed: {proc.stderr.strip()}")
    return proc.stdout.splitlines()
