"""`pip install .` keeps working for development, with the same entry point as the .deb."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_pip_install_gives_the_memqos_systemd_command(tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--no-cache-dir", "--target", str(target), str(REPO)],
                       capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)  # not from the repo: the installed copy must be the one imported
    assert p.returncode == 0, p.stderr
    script = target / "bin" / "memqos-systemd"
    assert script.exists(), sorted(os.listdir(target))
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, str(script), "plan", "--pods", str(REPO / "examples" / "pods.json"),
                          "--config", str(REPO / "examples" / "config.yaml"), "--output", "json"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"kubepods.slice"' in out.stdout
    where = subprocess.run([sys.executable, "-c", "import memqos_systemd; print(memqos_systemd.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.stdout.startswith(str(target)), where.stdout
