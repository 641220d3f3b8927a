# Sourced by the guest scripts (tests/vm/*.sh): one line per check, "ok: ..." or "FAIL: ...";
# $failed becomes 1 once any check failed. `must` is a step the rest depends on: on failure it
# shows the unit's status and journal and ends the script.
failed=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; failed=1; }
check() { what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
must() {
  what=$1; shift
  if "$@"; then ok "$what"; return 0; fi
  bad "$what"
  echo "--- systemctl status sealnode"; systemctl status --no-pager -l sealnode.service 2>&1 | tail -20
  echo "--- journal of sealnode"; journalctl -u sealnode --no-pager 2>&1 | tail -60
  exit 1
}
