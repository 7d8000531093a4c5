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


# Issue 33: a message or the conffile that names a document names it where the package puts it.
_DOC_DIR = "/usr/share/doc/memqos-systemd/"
_CITED = re.compile(r"(/usr/share/(?:doc/)?memqos-systemd/[\w./-]+\w)")


def _installed_by_the_package() -> dict[str, str]:
    """Installed path -> source path, from debian/memqos-systemd.{docs,examples,install}
    (dh_compress leaves *.md alone: debian/rules)."""
    out = {}

    def lines(name):
        text = repo_file("debian", f"memqos-systemd.{name}").read_text(encoding="utf-8")
        return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for (src,) in lines("docs"):
        out[_DOC_DIR + src.rsplit("/", 1)[-1]] = src
    for (src,) in lines("examples"):
        out[_DOC_DIR + "examples/" + src.rsplit("/", 1)[-1]] = src
    for src, dest in lines("install"):
        if "*" not in src:
            out["/" + dest.rstrip("/") + "/" + src.rsplit("/", 1)[-1]] = src
    return out


def _product_texts() -> dict[str, str]:
    """What an operator reads from the package: the code's strings, the conffile, the units, the man page."""
    import ast
    texts = {}
    for path in sorted(repo_file("memqos_systemd").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        texts[path.name] = "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                                     and isinstance(n.value, str) and id(n) not in docstrings)
    texts["etc/config.yaml"] = repo_file("etc", "config.yaml").read_text(encoding="utf-8")
    for unit in sorted(repo_file("units").iterdir()):
        texts[f"units/{unit.name}"] = unit.read_text(encoding="utf-8")
    texts["man page"] = man_text()
    return texts


def test_every_document_the_product_cites_is_installed_by_the_package():
    installed = _installed_by_the_package()
    cited = {(where, path) for where, text in _product_texts().items() for path in _CITED.findall(text)
             if path.startswith(_DOC_DIR) or path.endswith(".md")}
    assert cited
    for where, path in sorted(cited):
        assert path in installed, (where, path, "not in debian/memqos-systemd.{docs,examples,install}")
        assert repo_file(*installed[path].split("/")).is_file(), (where, path)


def test_no_message_or_conffile_cites_a_document_by_its_place_in_the_source_tree():
    """README, docs/DESIGN.md: not where an operator of the .deb finds them."""
    texts = _product_texts()
    texts = {w: t for w, t in texts.items() if w != "man page"}
    bare = re.compile(r"(?<![/\w])(?:docs/)?(?:README|DESIGN|DEPLOY|PACKAGING|RELIABILITY|BENCHMARKS|runbook)"
                      r"\b(?:\.md)?")
    for where, text in texts.items():
        for line in text.splitlines():
            if where == "etc/config.yaml" and not line.startswith("#"):
                continue
            assert not bare.search(line), (where, line)


def test_the_packaged_readme_cites_only_documents_the_package_ships():
    """Issue 43: the README the .deb installs named docs/BENCHMARKS.md, RELIABILITY.md and
    PACKAGING.md, which it did not ship."""
    shipped = set(repo_file("debian", "memqos-systemd.docs").read_text(encoding="utf-8").split())
    cited = set(re.findall(r"\bdocs/[\w-]+\.md\b", repo_file("README.md").read_text(encoding="utf-8")))
    assert cited and cited <= shipped, sorted(cited - shipped)


def test_nothing_cites_notes_that_live_outside_the_repository():
    """Issue 43: DESIGN cited ../shared/notes/, which neither the repository nor the package has."""
    roots = ["README.md", "docs", "memqos_systemd", "etc", "man", "units", "deploy", "monitoring",
             "completion", "debian", "bench", "scripts", "tests"]
    outside = re.compile(r"\.\./shared\b|\bshared/notes\b")
    for root in roots:
        base = repo_file(root)
        for path in [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if path.name != "test_docs_agree.py":
                assert not outside.search(text), path.relative_to(base.parent)


def _build_depends() -> set[str]:
    control = repo_file("debian", "control").read_text(encoding="utf-8")
    block = re.search(r"^Build-Depends:\n((?: .*\n)+)", control, re.M).group(1)
    return {line.strip().rstrip(",").split()[0] for line in block.splitlines() if line.strip()}


def test_the_build_depends_have_every_package_the_tests_need_and_packaging_md_names_them():
    """Issue 33: openssl (the TLS tests) was in install-deps.sh's test list but not a Build-Depends,
    and docs/PACKAGING.md's rows named neither jsonpatch nor prometheus."""
    script = repo_file("scripts", "install-deps.sh").read_text(encoding="utf-8")
    runtime, test = (re.search(rf"^{name}=\(([^)]*)\)", script, re.M).group(1).split() for name in ("runtime", "test"))
    needed = set(test) | (set(runtime) - {"python3", "python3-venv"})
    assert needed <= _build_depends(), needed - _build_depends()
    row = next(line for line in repo_file("docs", "PACKAGING.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `control` |"))
    for pkg in set(test) - {"python3-pytest", "python3-hypothesis", "python3-jsonpatch"}:
        assert f"`{pkg}`" in row, pkg
    for word in ("pytest", "hypothesis", "jsonpatch"):
        assert word in row, word


def test_packaging_md_names_every_file_pybuild_copies_for_the_tests():
    files = [line.strip() for line in repo_file("debian", "pybuild.testfiles").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    row = next(line for line in repo_file("docs", "PACKAGING.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `pybuild.testfiles` |"))
    assert files
    for name in files:
        assert f"`{name}`" in row, name
    rules = repo_file("debian", "rules").read_text(encoding="utf-8")
    for deselected in re.findall(r"--deselect \S+::(\w+)", rules) + re.findall(r"--ignore (\S+)", rules):
        assert deselected in repo_file("docs", "PACKAGING.md").read_text(encoding="utf-8"), deselected


def test_pybuild_testfiles_copies_no_file_below_a_folder():
    """pybuild copies each entry of pybuild.testfiles to the build directory by its last name
    (dhpython's copy_test_files): `bench/guest/press.py` lands as `press.py`, where nothing looks
    for it (the .deb's build tests failed so). Top-level files and folders only; a test finds
    anything else in the source tree above (repo_docs.repo_file)."""
    entries = [line.strip() for line in repo_file("debian", "pybuild.testfiles").read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.startswith("#")]
    for name in entries:
        assert "/" not in name, name


def test_every_metric_the_docs_name_with_labels_has_those_labels():
    """Issue 33: DESIGN named memqos_foreign_writes_total{unit=...}; its labels are level and writer."""
    from prometheus_client import CollectorRegistry

    from memqos_systemd.metrics import Metrics
    registry = CollectorRegistry()
    Metrics(registry)
    labels = {}
    for collector in registry._collector_to_names:
        for name in registry._collector_to_names[collector]:
            labels[name] = set(getattr(collector, "_labelnames", ()))
    docs = [("README.md",), ("docs", "DESIGN.md"), ("docs", "DEPLOY.md"), ("docs", "runbook.md"),
            ("monitoring", "README.md")]
    seen = 0
    for parts in docs:
        text = repo_file(*parts).read_text(encoding="utf-8")
        for metric, inside in re.findall(r"\b(memqos_\w+)\{([^}]*)\}", text):
            if metric not in labels:
                continue
            named = {re.split(r"[=!~]", item.strip())[0] for item in inside.split(",") if item.strip()}
            assert named <= labels[metric], ("/".join(parts), metric, named - labels[metric])
            seen += 1
    assert seen
