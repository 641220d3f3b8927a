#!/bin/sh
# Runs INSIDE the test guest (scripts/vm run), booted once with a software TPM: every scenario
# of the 6.12 kernel one after the other (a boot under software emulation costs minutes, so
# the scenarios share one). Each scenario's output is framed by "=== BEGIN SCRIPT" and
# "=== END SCRIPT STATUS"; tests/vm.rs checks each section on its own. Between scenarios every
# sealnode unit is stopped. Exits 1 if any scenario failed.
#
#   tests/vm/suite.sh REPO CACHE DEB [SCRIPT...]   # by hand: only the scripts named
set -u
REPO=$1 CACHE=$2 DEB=$3
shift 3
[ $# -gt 0 ] || set -- tests/vm/unit.sh tests/vm/limits.sh tests/vm/tpm.sh tests/vm/container.sh
worst=0
for s in "$@"; do
  echo "=== BEGIN $s"
  t0=$(date +%s)
  sh "$REPO/$s" "$REPO" "$CACHE" "$DEB"
  code=$?
  echo "=== END $s $code $(($(date +%s) - t0))"
  [ "$code" = 0 ] || worst=1
  # The units a scenario may leave running, by name: a glob would match this run's own unit
  # (sealnode-vm-test.service), whose stop powers the guest off.
  # So are the gateway stand-ins a scenario starts (one left listening on 127.0.0.1:18765
  # answered the next scenario's node, then exited under it).
  systemctl stop sealnode.service sealnode-rootless.service 'sealnode@*.service' \
    sealnode-vm-gateway.service sealnode-vm-gw-a.service sealnode-vm-gw-b.service sealnode-ctr-gateway.service 2>/dev/null
  systemctl reset-failed sealnode.service sealnode-rootless.service 'sealnode@*.service' \
    sealnode-vm-gateway.service sealnode-vm-gw-a.service sealnode-vm-gw-b.service sealnode-ctr-gateway.service 2>/dev/null
done
exit $worst
