#!/usr/bin/env bash
# Fresh statements (docs/attestation.md): what `sealnode attest --nonce` costs a gateway's
# request against a running cell, signed only and TPM-bound (Debian's swtpm: PCR 23 reset and
# extend, a quote of PCRs 0-7 and 23, the quote checked), next to the anchor: tpm2_quote alone
# on the same TPM. hyperfine medians; the commands alternate within one run.
. "$(dirname "$0")/common.sh"
command -v swtpm >/dev/null && command -v tpm2_quote >/dev/null ||
  { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq swtpm tpm2-tools >/dev/null; }
TPM=$BENCH/attest-tpm PORT=${SEALNODE_BENCH_TPM_PORT:-24321}
rm -rf "$TPM"; mkdir -p "$TPM"
swtpm socket --tpm2 --tpmstate "dir=$TPM" --server "type=tcp,port=$PORT,bindaddr=127.0.0.1" \
  --ctrl "type=tcp,port=$((PORT + 1)),bindaddr=127.0.0.1" --flags not-need-init,startup-clear &
tpm_pid=$!
pids=("$tpm_pid")
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
sleep 0.5
# Two cells alike but for cell.tpm (and the engine's port): busybox httpd as the engine, the
# node asleep.
for c in plain tpm; do
  p=18080; [ "$c" = tpm ] && p=18081
  write_fixture "$BENCH/attest-$c" rootful
  sed -i -e "0,/command = \[\"\/usr\/bin\/true\"\]/s##command = [\"/usr/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:$p\", \"-h\", \"/models\"]#" \
    -e 's#command = \["/usr/bin/true"\]#command = ["/usr/bin/busybox", "sleep", "100000"]#' -e "s/^port = 18080/port = $p/" "$BENCH/attest-$c/c.toml"
  [ "$c" = tpm ] && sed -i "/^stop_timeout_s/a tpm = { tcti = \"swtpm:host=127.0.0.1,port=$PORT\" }" "$BENCH/attest-$c/c.toml"
  "$SN" attest init --config "$BENCH/attest-$c/c.toml" >/dev/null
  [ "$c" = tpm ] && "$SN" attest tpm-init --config "$BENCH/attest-$c/c.toml" >/dev/null
  "$SN" run --config "$BENCH/attest-$c/c.toml" >/dev/null 2>&1 &
  pids+=("$!")
done
for c in plain tpm; do
  for _ in $(seq 1 300); do [ -s "$BENCH/attest-$c/run/attest/statement.json" ] && break; sleep 0.1; done
done
export TPM2TOOLS_TCTI="swtpm:host=127.0.0.1,port=$PORT"
N=00112233445566778899aabbccddeeff
Q=$(cd "$TPM" && pwd)
echo "### attest --nonce against a running cell (rootful), hyperfine medians"
hyperfine -N --warmup 3 --runs "${RUNS:-30}" --export-json "$BENCH/attest.json" \
  -n "tpm2_quote alone (anchor)" "tpm2_quote -c 0x81010002 -g sha256 -l sha256:0,1,2,3,4,5,6,7,23 -q $N -m $Q/q.msg -s $Q/q.sig -o $Q/q.pcrs" \
  -n "attest --nonce, signed" "$SN attest --nonce $N --config $BENCH/attest-plain/c.toml" \
  -n "attest --nonce, signed + TPM quote" "$SN attest --nonce $N --config $BENCH/attest-tpm/c.toml" >/dev/null
hyperfine_table "$BENCH/attest.json" tpm2_quote
