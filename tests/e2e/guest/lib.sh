# Shell helpers for e2e scenarios:  . "$MEMQOS_E2E_GUEST/lib.sh"
# Prints the CHECK/SKIP lines the driver collects. See tests/e2e/README.md.

# check WHAT COMMAND [ARGS...]: CHECK ok if the command succeeds, else CHECK fail.
check() {
  local what=$1; shift
  if "$@"; then echo "CHECK ok $what"; else echo "CHECK fail $what (command: $*)"; fi
}

# check_eq WHAT ACTUAL EXPECTED
check_eq() {
  if [ "$2" = "$3" ]; then echo "CHECK ok $1: $2"
  else echo "CHECK fail $1: '$2' != expected '$3'"; fi
}

# check_file_eq FILE EXPECTED [WHAT]: the file's content (trimmed) equals EXPECTED.
check_file_eq() {
  local actual
  actual=$(cat "$1" 2>&1 | tr -d '\n') || true
  check_eq "${3:-$1}" "$actual" "$2"
}

# wait_until SECONDS COMMAND [ARGS...]: retry every 0.2 s; status of the last try.
wait_until() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

# skip REASON: end the scenario as skipped.
skip() { echo "SKIP $*"; exit 77; }

# need_deb: skip if the payload has no .deb; fail if it has one that did not install.
need_deb() {
  [ -n "${MEMQOS_E2E_DEBS:-}" ] || skip "no .deb in the payload (make deb puts it in build/deb/)"
  if [ "${MEMQOS_E2E_DEB_INSTALLED:-0}" != 1 ]; then
    echo "CHECK fail the payload's .deb installed (see install.log in the results)"
    exit 1
  fi
}

# pause_memqos: if memqos-systemd.service runs (the payload's .deb starts it), stop it for the
# rest of this scenario and start it again on exit. For scenarios that check systemd or the
# harness itself and must not race the daemon's own SetUnitProperties.
pause_memqos() {
  if systemctl is-active -q memqos-systemd.service 2>/dev/null; then
    systemctl stop memqos-systemd.service
    trap 'systemctl start memqos-systemd.service' EXIT
  fi
}
