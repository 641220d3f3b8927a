#!/usr/bin/env bash
# sealnode in a container vs sealnode on the host, in the test guest (podman cannot start a
# container on this host: docs/containers.md), side by side in one boot: start to ready and a
# job's latency (bench/container-guest.sh says how). Reuses scripts/test-guest's caches (the
# guest, the package in target/vm, the image's rootfs); builds what is missing.
#
#   sudo bench/container.sh          # ROUNDS_START (5), ROUNDS_JOB (20)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SEALNODE_TEST_CACHE:-/var/tmp/sealnode-test}
OUT=${BENCH_OUT:-target/bench}/container
[ -f "$CACHE/env" ] || ./scripts/prepare-python >/dev/null
rm -rf "$OUT"; mkdir -p "$OUT"
./scripts/vm build > "$OUT/build.txt" 2>&1 || { tail -5 "$OUT/build.txt"; exit 1; }
CARGO_TARGET_DIR="$PWD/target/vm" ./scripts/build-deb > "$OUT/deb.txt" 2> "$OUT/deb.err" || { tail -20 "$OUT/deb.err"; exit 1; }
deb=$(tail -1 "$OUT/deb.txt")
./scripts/build-image rootfs "$deb" "$(dirname "$deb")/sealnode-rootfs.tar" > "$OUT/image.txt" 2>&1 || { tail -20 "$OUT/image.txt"; exit 1; }
env SEALNODE_VM_SHARE="$PWD:$CACHE:$(dirname "$deb")" SEALNODE_VM_KERNEL=trixie SEALNODE_VM_OUT="$OUT/guest" \
  SEALNODE_VM_TIMEOUT=3600 ./scripts/vm run "$PWD/bench/container-guest.sh" "$PWD" "$CACHE" "$deb" \
  "${ROUNDS_START:-5}" "${ROUNDS_JOB:-20}" > "$OUT/run.txt" 2>&1 || true
if [ -f "$OUT/guest/container-bench.md" ]; then cat "$OUT/guest/container-bench.md"; else tail -40 "$OUT/run.txt"; exit 1; fi
