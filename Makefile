# Every target installs what it needs (Debian packages, the venv) itself.
# The venv uses Debian's python3 and its packages (--system-site-packages),
# the same versions the .deb depends on.
PYTHON := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
EXAMPLE_ARGS := --pods examples/pods.json --config examples/config.yaml --node-memory 16Gi

.PHONY: demo test test-unit test-integration test-e2e deb autopkgtest image bench clean deps-runtime deps-test

# The main job: show the plan for an example node.
demo: $(VENV)/.installed
	$(VENV)/bin/memqos-systemd plan $(EXAMPLE_ARGS) --output table

# The whole test suite: unit, integration (private dbus-daemon), e2e (real systemd in qemu).
# About 25-35 minutes (README), as root; the e2e part prints a line per finished scenario as the VM runs.
# The unit and integration tests run once, in the package build (against the built package, as
# dpkg-buildpackage runs them); the venv then runs the VM suite and the manifests' schema test,
# whose validator (kubernetes-validate) only PyPI has.
SCHEMA_TEST := tests/unit/test_deploy_kubernetes.py::test_every_object_is_valid_for_the_kubernetes_api
test: $(VENV)/.installed deps-test $(VENV)/.pypi-test
	scripts/install-deps.sh deb e2e image
	$(MAKE) deb                             # with the unit and integration tests, as dpkg-buildpackage runs them
	scripts/build-image.sh                  # the DaemonSet's image, from that .deb (e2e 18-daemonset)
	$(PY) -m pytest $(SCHEMA_TEST) tests/e2e -v -ra

# test-unit needs root for apt: it installs the Debian packages of scripts/install-deps.sh test
# (pytest, hypothesis, jsonpatch, dbus, openssl, and prometheus for promtool, installed without
# starting or enabling its server) and one PyPI package, kubernetes-validate, into the venv only.
test-unit: $(VENV)/.installed deps-test $(VENV)/.pypi-test
	$(PY) -m pytest tests/unit -q

test-integration: $(VENV)/.installed deps-test
	$(PY) -m pytest tests/integration -q

test-e2e: $(VENV)/.installed deps-test
	scripts/install-deps.sh deb e2e image
	DEB_BUILD_OPTIONS=nocheck $(MAKE) deb
	scripts/build-image.sh
	$(PY) -m pytest tests/e2e -v -ra

deb:
	scripts/install-deps.sh deb
	scripts/build-deb.sh

# debian/tests/ (autopkgtest) against the .deb `make deb` built, on this machine: the null
# server installs the package and its test Depends here (root). Not part of `make test`.
autopkgtest:
	scripts/install-deps.sh autopkgtest
	@deb=$$(ls build/deb/memqos-systemd_*_all.deb 2>/dev/null | tail -n1); \
	  [ -n "$$deb" ] || { echo "autopkgtest: no .deb in build/deb/: run make deb first" >&2; exit 1; }; \
	  autopkgtest "$$deb" . -- null

# The DaemonSet's OCI image (deploy/kubernetes/, docs/DEPLOY.md), built from the .deb:
# build/image/memqos-systemd_<version>.oci.tar.
image: deb
	scripts/install-deps.sh image
	scripts/build-image.sh

deps-runtime:
	scripts/install-deps.sh runtime

deps-test:
	scripts/install-deps.sh test

# The one test tool Debian does not package: the Kubernetes API schema validator, into the
# venv only (tests/unit/test_deploy_kubernetes.py).
$(VENV)/.pypi-test: tests/requirements-pypi.txt $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/requirements-pypi.txt
	touch $@

$(VENV)/.installed: pyproject.toml
	scripts/install-deps.sh runtime
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --disable-pip-version-check -e .
	touch $@

# The e2e guest images (about 1.1 GB on disk each by du -sh: 1122 MB measured 2026-11-28) and the VM runs' logs are kept outside the tree, on purpose.
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
	@echo "kept: the e2e guest image in /var/cache/memqos-e2e ($$(du -sh /var/cache/memqos-e2e 2>/dev/null | cut -f1 || echo absent))" \
	  "and the VM runs' logs in /var/tmp/memqos-e2e-runs; drop them with: sudo rm -rf /var/cache/memqos-e2e /var/tmp/memqos-e2e-runs"
