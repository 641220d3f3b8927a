#!/bin/sh
# Runs INSIDE the test guest booted with a software TPM (SEALNODE_VM_TPM=1: Debian's swtpm on
# the host, a tpm-tis device here): the unit binds its statements to that TPM. The package and
# the demo's config as unit.sh installs them, `cell.tpm` on /dev/tpmrm0, `attest init` and
# `attest tpm-init`, the drop-in docs/attestation.md gives, then `systemctl start` and fresh
# statements. The envelopes, nonces and keys land in /mnt/out for the host to verify with both
# verifiers (tests/vm.rs). One line per check, "ok: ..." or "FAIL: ..."; exits 1 if any failed.
#
#   tests/vm/tpm.sh REPO CACHE DEB
set -u
REPO=$1
OUT=/mnt/out
CFG=/etc/sealnode/sealnode.toml
# shellcheck source=tests/vm/checks.sh
. "$REPO/tests/vm/checks.sh"
echo "guest: $(uname -r), $(cat /proc/1/comm) as PID 1"
SEALNODE_VM_SETUP_ONLY=1 sh "$REPO/tests/vm/unit.sh" "$@" | grep -v "^Creating"
# The venv at the path unit.sh binds the host's test cache to (the unit's PrivateTmp= hides /var/tmp).
# shellcheck disable=SC1091
. "$2/env"
SEALNODE_TEST_VENV=/opt/sealnode-test${SEALNODE_TEST_VENV#"$2"}
must "the guest has a TPM: /dev/tpmrm0" test -c /dev/tpmrm0
sed -i '/^\[cell\]$/a tpm = { tcti = "device:/dev/tpmrm0" }' "$CFG"
must "cell.tpm is in the config" grep -q '^tpm = { tcti = "device:/dev/tpmrm0" }' "$CFG"
must "attest init" sh -c "/usr/bin/sealnode attest init --config $CFG >/dev/null"
must "attest tpm-init makes the attestation key in the TPM" sh -c "/usr/bin/sealnode attest tpm-init --config $CFG > $OUT/tpm-init.txt 2>&1"
/usr/bin/sealnode attest tpm-pubkey --config "$CFG" | sed -n '1,/END PUBLIC KEY/p' > "$OUT/ak.pem"
/usr/bin/sealnode attest pubkey --config "$CFG" | sed -n '1,/END PUBLIC KEY/p' > "$OUT/pubkey.pem"
cp /var/lib/sealnode/attest/tpm-ek.pem "$OUT/ek.pem"

# No role gets the TPM under another name: a device node with tpmrm0's numbers (the kernel's
# tpmrm class, found through /sys/dev/char), by `devices` and by a CDI spec, is refused by
# `check` and `run` (125), naming the field.
mm=$(stat -c '%t %T' /dev/tpmrm0)
mknod /dev/accel-x c $((0x${mm% *})) $((0x${mm#* })) && mknod /dev/accel-y c $((0x${mm% *})) $((0x${mm#* }))
cp "$CFG" /tmp/sealnode.toml.orig
sed -i '/^\[engine\]$/a devices = ["/dev/accel-x"]' "$CFG"
/usr/bin/sealnode check --config "$CFG" > /tmp/tpmdev.txt 2>&1; code=$?
check "a TPM under another name (devices): check refuses (exit $code)" sh -c "[ $code = 125 ] && grep -q 'engine.devices' /tmp/tpmdev.txt && grep -q 'is a TPM' /tmp/tpmdev.txt"
timeout 120 /usr/bin/sealnode run --config "$CFG" > /tmp/tpmdev.txt 2>&1; code=$?
check "a TPM under another name (devices): run refuses (exit $code)" sh -c "[ $code = 125 ] && grep -q 'engine.devices' /tmp/tpmdev.txt"
mkdir -p /etc/cdi
cat > /etc/cdi/tpmtest.yaml <<'YAML'
cdiVersion: "0.6.0"
kind: example.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/accel-y
YAML
chmod 0644 /etc/cdi/tpmtest.yaml
cp /tmp/sealnode.toml.orig "$CFG"
sed -i '/^\[engine\]$/a devices_from = { cdi = "/etc/cdi/tpmtest.yaml", devices = ["example.com/gpu=0"] }' "$CFG"
/usr/bin/sealnode check --config "$CFG" > /tmp/tpmdev.txt 2>&1; code=$?
check "a TPM under another name (a CDI spec): check refuses (exit $code)" sh -c "[ $code = 125 ] && grep -q 'engine.devices_from' /tmp/tpmdev.txt && grep -q 'is a TPM' /tmp/tpmdev.txt"
timeout 120 /usr/bin/sealnode run --config "$CFG" > /tmp/tpmdev.txt 2>&1; code=$?
check "a TPM under another name (a CDI spec): run refuses (exit $code)" sh -c "[ $code = 125 ] && grep -q 'engine.devices_from' /tmp/tpmdev.txt"
cp /tmp/sealnode.toml.orig "$CFG"
rm -f /dev/accel-x /dev/accel-y /etc/cdi/tpmtest.yaml

# Without the drop-in the unit's private /dev has no TPM: the start is refused (125, no
# restart loop), naming cell.tpm.
systemctl reset-failed sealnode.service 2>/dev/null
timeout 120 systemctl start sealnode.service 2>/dev/null
check "without the drop-in the start is refused (exit $(systemctl show -p ExecMainStatus --value sealnode.service))" \
  test "$(systemctl show -p ExecMainStatus --value sealnode.service)" = 125
check "and the journal says cell.tpm" sh -c "journalctl -u sealnode --no-pager | grep -q 'cell.tpm'"
systemctl stop sealnode.service 2>/dev/null; systemctl reset-failed sealnode.service 2>/dev/null

# The drop-in, exactly as docs/attestation.md gives it.
mkdir -p /etc/systemd/system/sealnode.service.d
awk '/<!-- tpm-drop-in -->/ { f = 1; next } f && /^```ini/ { g = 1; next } g && /^```/ { exit } g' \
  "$REPO/docs/attestation.md" > /etc/systemd/system/sealnode.service.d/tpm.conf
must "the drop-in from docs/attestation.md ($(tr '\n' ' ' < /etc/systemd/system/sealnode.service.d/tpm.conf))" \
  grep -q '^DeviceAllow=/dev/tpmrm0 rw' /etc/systemd/system/sealnode.service.d/tpm.conf
systemctl daemon-reload

# The gateway stand-in, so the node has its gateway (as in unit.sh).
systemd-run --unit=sealnode-vm-gateway --service-type=exec -p StandardOutput=journal \
  "$SEALNODE_TEST_VENV/bin/python" -u /usr/local/share/sealnode-standin/standin-gateway.py --port 18765 --model standin --timeout 600 >/dev/null 2>&1
sleep 1
must "systemctl start with the TPM returns (after READY)" timeout 300 systemctl start sealnode.service
check "the journal says the TPM's key was checked" sh -c "journalctl -u sealnode --no-pager | grep -q 'TPM attestation key checked'"
hexnonce() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
N0=$(hexnonce); N1=$(hexnonce)
echo "$N0" > "$OUT/n0"; echo "$N1" > "$OUT/n1"
must "attest --nonce (the TPM quotes it)" sh -c "/usr/bin/sealnode attest --nonce $N0 --config $CFG > $OUT/a0.json"
must "a second attest --nonce" sh -c "/usr/bin/sealnode attest --nonce $N1 --config $CFG > $OUT/a1.json"
cp /run/sealnode/attest/statement.json "$OUT/start.json"
check "the guest's own verifier: a1 verifies with the TPM key" \
  sh -c "/usr/bin/sealnode verify-attestation --pubkey $OUT/pubkey.pem --tpm-ak $OUT/ak.pem --nonce $N1 $OUT/a1.json > $OUT/verify.txt"
cat "$OUT/verify.txt"
check "the start-time statement is quoted too" \
  /usr/bin/sealnode verify-attestation --pubkey "$OUT/pubkey.pem" --tpm-ak "$OUT/ak.pem" --no-nonce "$OUT/start.json"
check "the unit is still active" test "$(systemctl show -p ActiveState --value sealnode.service)" = active
check "systemctl stop returns" timeout 120 systemctl stop sealnode.service
systemctl stop sealnode-vm-gateway.service 2>/dev/null
exit $failed
