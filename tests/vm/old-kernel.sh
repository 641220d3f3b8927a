#!/bin/sh
# Runs INSIDE the test guest booted with bookworm's kernel 6.1 (Landlock ABI 3; sealnode's
# policies need ABI 6): the package installs, but `sealnode doctor` and `sealnode run` refuse,
# naming the missing kernel feature and what to do.
#
#   tests/vm/old-kernel.sh REPO CACHE DEB
set -u
# shellcheck source=tests/vm/checks.sh
. "$1/tests/vm/checks.sh"
echo "guest: $(uname -r), $(cat /proc/1/comm) as PID 1"
SEALNODE_VM_SETUP_ONLY=1 sh "$1/tests/vm/unit.sh" "$@" | grep -v "^Creating"
out=$(/usr/bin/sealnode doctor 2>&1); rc=$?
echo "$out" | sed 's/^/doctor: /' | grep -i "landlock" | head -5
if [ "$rc" -ne 0 ] && echo "$out" | grep -qi "landlock"; then ok "doctor refuses (exit $rc), naming Landlock"; else bad "doctor exit $rc: $out"; fi
out=$(timeout 60 /usr/bin/sealnode run --config /etc/sealnode/sealnode.toml 2>&1); rc=$?
echo "$out" | sed 's/^/run: /' | tail -3
if [ "$rc" -eq 125 ] && echo "$out" | grep -q "Landlock ABI 6" && echo "$out" | grep -q "fix:"; then
  ok "run refuses with 125, naming Landlock ABI 6 and the fix"
else
  bad "run exit $rc"
fi
exit $failed
