#!/usr/bin/env bash
# Footprint: the supervisor's resident memory and CPU while the cell idles (busybox httpd as the
# engine, a sleeping node), and the canary battery's wall time per role (hyperfine; includes
# building the cell). As root.
. "$(dirname "$0")/common.sh"
IDLE=${IDLE:-10}
write_fixture "$BENCH/foot" rootful
sed -i '0,/command = \["\/usr\/bin\/true"\]/s||command = ["/usr/bin/busybox", "httpd", "-f", "-p", "127.0.0.1:18080", "-h", "/models"]|' "$BENCH/foot/c.toml"
sed -i 's|command = \["/usr/bin/true"\]|command = ["/bin/sleep", "100000"]|' "$BENCH/foot/c.toml"
"$SN" run --config "$BENCH/foot/c.toml" >/dev/null 2>&1 & run=$!
sleep 3
ticks() { awk '{print $14 + $15}' "/proc/$run/stat"; }
t0=$(ticks); sleep "$IDLE"; t1=$(ticks)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$run/status")
kill -TERM $run; wait $run || true
echo "### footprint"
echo "| what | value |"
echo "|---|---:|"
echo "| supervisor RSS, cell idle | $((rss / 1024)).$(( (rss % 1024) * 10 / 1024 )) MiB |"
echo "| supervisor CPU over ${IDLE} s idle | $(( (t1 - t0) * 10 )) ms |"
echo
echo "### canary battery wall time (hyperfine, includes building a cell)"
md=$(mktemp)
taskset -c "$CPU" hyperfine -N -w 3 -r "${RUNS:-20}" --style none --export-markdown "$md" \
  -n "canary, engine role" "$SN canary --config $BENCH/foot/c.toml --role engine" \
  -n "canary, node role" "$SN canary --config $BENCH/foot/c.toml --role node" \
  -n "canary, both roles" "$SN canary --config $BENCH/foot/c.toml" >/dev/null 2>&1
cat "$md"; rm -f "$md"
