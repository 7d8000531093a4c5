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
# About 40-45 minutes on a fresh machine (README), as root; the e2e part prints a line per finished scenario as the VM runs.
# The unit and integration tests run once, in the package build (against the built package, as
# dpkg-buildpackage runs them); the venv then runs the VM suite and the manifests' checks against
# the Kubernetes API, which need the Go module proxy (tests/kube_api.py) as a package build must not.
KUBE_API_TEST := tests/unit/test_deploy_kubernetes_api.py
# The real node the e2e guest runs (tests/e2e/guest/realnode.py, scenario 58): the kubelet and
# containerd built from the Go module proxy by scripts/build-go.sh, minutes the first time (README),
# then found in its cache by a key of their versions.
GUEST_GO := kubelet containerd containerd-shim-runc-v2 ctr
test: $(VENV)/.installed deps-test
	scripts/install-deps.sh deb e2e image
	$(MAKE) deb                             # with the unit and integration tests, as dpkg-buildpackage runs them
	scripts/build-image.sh                  # the DaemonSet's image, from that .deb (e2e 18-daemonset)
	scripts/build-go.sh $(GUEST_GO) >/dev/null  # the guest's real node (e2e 58), cached by key
	$(PY) -m pytest $(KUBE_API_TEST) tests/e2e -v -ra

# test-unit needs root for apt: it installs the Debian packages of scripts/install-deps.sh test
# (pytest, hypothesis, jsonpatch, jsonschema, dbus, openssl, and prometheus for promtool, installed
# without starting or enabling its server); the manifests' API checks take Go modules from the proxy.
test-unit: $(VENV)/.installed deps-test
	$(PY) -m pytest tests/unit -q

test-integration: $(VENV)/.installed deps-test
	$(PY) -m pytest tests/integration -q

test-e2e: $(VENV)/.installed deps-test
	scripts/install-deps.sh deb e2e image
	DEB_BUILD_OPTIONS=nocheck $(MAKE) deb
	scripts/build-image.sh
	scripts/build-go.sh $(GUEST_GO) >/dev/null
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
	scripts/install-deps.sh test kubeapi

$(VENV)/.installed: pyproject.toml
	scripts/install-deps.sh runtime
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --disable-pip-version-check -e .
	touch $@

# The e2e guest images (about 1.1 GB on disk each by du -sh: 1122 MB measured 2026-11-28), the Go builds (scripts/build-go.sh,
# in /var/cache/memqos-e2e/go) and the VM runs' logs are kept outside the tree, on purpose.
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
	@echo "kept: the e2e guest image and the Go builds in /var/cache/memqos-e2e ($$(du -sh /var/cache/memqos-e2e 2>/dev/null | cut -f1 || echo absent))," \
	  "the Go module cache ($$(du -sh "$$(go env GOMODCACHE 2>/dev/null || echo /nonexistent)" 2>/dev/null | cut -f1 || echo absent)) and the VM runs' logs in /var/tmp/memqos-e2e-runs;" \
	  "drop them with: sudo rm -rf /var/cache/memqos-e2e /var/tmp/memqos-e2e-runs; go clean -modcache"
