#!/usr/bin/env bash
# Model digests for the attestation's subjects (docs/attestation.md): the cost a start pays for
# a multi-GB model, first (nothing cached: every byte hashed) and then (cached per device,
# inode, size, mtime and ctime: one stat per file), next to coreutils' sha256sum of the same
# file as the anchor. `sealnode attest subjects` walks and hashes exactly as `run` does at a
# gate. The file is in the page cache for all three (it is read once before): this measures
# hashing, not the disk. SIZE_MB (default 4096) of random data, made once.
. "$(dirname "$0")/common.sh"
SIZE_MB=${SIZE_MB:-4096}
write_fixture "$BENCH/digests" rootful
MODEL=$BENCH/model-${SIZE_MB}m.bin
[ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = $((SIZE_MB << 20)) ] ||
  head -c $((SIZE_MB << 20)) /dev/urandom > "$MODEL"
ln -f "$MODEL" "$BENCH/digests/models/model.gguf"
cat "$MODEL" > /dev/null
CFG=$BENCH/digests/c.toml
CACHE=$BENCH/digests/state/model-digests.json
echo "### model digests: one ${SIZE_MB} MiB model file (page cache warm), hyperfine medians"
# One --prepare per command (a single one would run before every command).
hyperfine -N --warmup 1 --runs "${RUNS:-5}" --export-json "$BENCH/digests.json" \
  --prepare "true" -n "sha256sum (anchor)" "sha256sum $MODEL" \
  --prepare "rm -f $CACHE" -n "attest subjects, nothing cached" "$SN attest subjects --config $CFG" \
  --prepare "true" -n "attest subjects, cached" "$SN attest subjects --config $CFG" >/dev/null
hyperfine_table "$BENCH/digests.json" sha256sum
