#!/usr/bin/env bash
# Install the Debian packages a job needs, only those missing, so a fresh
# Debian bookworm machine can run `make demo` / `make test` / `make deb`.
#   scripts/install-deps.sh runtime|test|kubeapi|deb|e2e|image|autopkgtest ...
set -euo pipefail

runtime=(python3 python3-venv python3-setuptools python3-dbus-next python3-pyudev python3-yaml python3-prometheus-client)
# prometheus: promtool checks and tests the rules in monitoring/ (tests/unit/test_monitoring.py);
# bookworm has promtool only in the server's package, installed below without starting the server.
test=(python3-pytest python3-hypothesis python3-jsonpatch dbus openssl prometheus)
# The manifests' checks against the Kubernetes API (tests/kube_api.py), which the package build
# leaves out (they take Go modules from the proxy): not a Build-Depends.
kubeapi=(python3-jsonschema)
deb=(build-essential debhelper dh-python pybuild-plugin-pyproject python3-all lintian fakeroot)
e2e=(qemu-system-x86 qemu-utils debootstrap e2fsprogs)
image=(mmdebstrap umoci)
# `make autopkgtest`: debian/tests/ run on this machine (autopkgtest's null server).
autopkgtest=(autopkgtest)

want=()
for group in "$@"; do
  case "$group" in
    runtime) want+=("${runtime[@]}") ;;
    test) want+=("${runtime[@]}" "${test[@]}") ;;
    kubeapi) want+=("${kubeapi[@]}") ;;
    deb) want+=("${runtime[@]}" "${test[@]}" "${deb[@]}") ;;
    e2e) want+=("${e2e[@]}") ;;
    image) want+=("${image[@]}") ;;
    autopkgtest) want+=("${autopkgtest[@]}") ;;
    *) echo "install-deps: unknown group '$group' (runtime, test, kubeapi, deb, e2e, image, autopkgtest)" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No service starts during the install (invoke-rc.d asks /usr/sbin/policy-rc.d; 101: forbidden):
# prometheus is here for promtool alone, and its prometheus.service would otherwise serve :9090.
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  policy=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while it installs test tools\nexit 101\n' > "$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# ... nor at the next boot.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  echo "install-deps: prometheus installed for promtool only; prometheus.service disabled and not started"
fi
