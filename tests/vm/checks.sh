# Sourced by the guest scripts (tests/vm/*.sh): one line per check, "ok: ..." or "FAIL: ...";
# $failed becomes 1 once any check failed. `must` is a step the rest depends on: on failure it
# shows the unit's status and journal and ends the script.
# Each line ends with the seconds since the script began, so a slow step shows in the log
# (the guest runs under software emulation: its cost is the suite's largest).
failed=0
checks_t0=$(date +%s)
at() { echo "[+$(($(date +%s) - checks_t0)) s]"; }
ok() { echo "ok: $* $(at)"; }
bad() { echo "FAIL: $* $(at)"; failed=1; }
check() { what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
not() { ! "$@"; }
# Wait up to SECONDS for background PID to exit and set $code to its status; one that does not
# exit is killed (SIGKILL) and counts as a failure, never a hang of the whole guest run.
wait_exit() {  # PID SECONDS
  for _ in $(seq 1 "$2"); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1"; wait "$1" 2>/dev/null; code=timeout; return 1; fi
  wait "$1"; code=$?
}
must() {
  what=$1; shift
  if "$@"; then ok "$what"; return 0; fi
  bad "$what"
  echo "--- systemctl status sealnode"; systemctl status --no-pager -l sealnode.service 2>&1 | tail -20
  echo "--- journal of sealnode"; journalctl -u sealnode --no-pager 2>&1 | tail -60
  exit 1
}
