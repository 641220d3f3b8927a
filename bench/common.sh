# Shared setup for the benchmarks (sourced). Needs root: it creates a fixture config with role
# users 61001/61002 under $BENCH and installs the public tools from Debian.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${SEALNODE_BENCH_DIR:-/var/tmp/sealnode-bench}
export PATH="$HOME/.cargo/bin:/usr/local/bin:/usr/bin:/bin:$PATH"
CPU=${SEALNODE_BENCH_CPU:-1}   # launch benchmarks are pinned to one CPU (see BENCHMARKING notes)

need=()
for p in hyperfine bubblewrap socat iperf3 python3-seccomp gcc libc6-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; fi

# The release build sealnode ships: statically linked (see docs/performance.md).
(cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet --target x86_64-unknown-linux-gnu --target-dir "$REPO/target/static" 2>/dev/null)
SN="$REPO/target/static/x86_64-unknown-linux-gnu/release/sealnode"
(cd "$REPO" && cargo build --release --quiet)
SN_DYN="$REPO/target/release/sealnode"

# Each binary under test from the same page-cache state: its cached pages dropped, so the
# warm-up runs read it back as the first start after a boot does. A binary the linker has just
# written starts ~9% slower than a copy of it (its page cache as the writes left it), which
# made a fresh build lose to an older copy of itself (2026-12-06).
from_disk() { for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none; done; }
from_disk "$SN" "$SN_DYN"

mkdir -p "$BENCH/bin" "$BENCH/pol"
gcc -O2 -static -o "$BENCH/bin/syscall-loop" "$REPO/bench/syscall-loop.c"
gcc -O2 -static -o "$BENCH/bin/pingpong" "$REPO/bench/pingpong.c"
chmod 0755 "$BENCH" "$BENCH/bin" "$BENCH/bin/"*
install -m 0644 "$REPO"/seccomp/*.json "$REPO"/landlock-rules/*.toml "$BENCH/pol/"
for role in node engine; do
  "$SN" seccomp-bpf "$BENCH/pol/$role.json" --role "$role" > "$BENCH/$role.sealnode.bpf"
  "$SN" seccomp-bpf "$BENCH/pol/$role.json" --role "$role" --seccompiler > "$BENCH/$role.seccompiler.bpf"
  /usr/bin/python3 "$REPO/bench/libseccomp-filter.py" "$BENCH/pol/$role.json" "$role" "$BENCH/$role.libseccomp.bpf"
done

# $1 = dir, $2 = rootful|rootless, $3 = extra [node] lines
write_fixture() {
  local d=$1 mode=$2 extra=${3:-}
  local eo=61001 no=61002 owner=0
  [ "$mode" = rootless ] && eo=65534 && no=65534 && owner=65534
  rm -rf "$d"; mkdir -p "$d"/{models,es,ns,state,run}
  chown "$eo:$eo" "$d/es"; chown "$no:$no" "$d/ns"; chmod 0700 "$d/es" "$d/ns"
  chown "$owner:$owner" "$d/state" "$d/run"; chmod 0755 "$d" "$d/models"
  echo cred > "$d/cred"; chown "$no:$no" "$d/cred"; chmod 0400 "$d/cred"
  local rootful=""
  [ "$mode" = rootful ] && rootful='rootful = { engine = "61001:61001", node = "61002:61002" }'
  cat > "$d/c.toml" <<TOML
schema = 1
[cell]
state_dir = "$d/state"
runtime_dir = "$d/run"
$rootful
stop_timeout_s = 2
[engine]
command = ["/usr/bin/true"]
port = 18080
seccomp = "$BENCH/pol/engine.json"
landlock = "$BENCH/pol/engine.toml"
models = "$d/models"
scratch = "$d/es"
ro_binds = [{ src = "$BENCH/bin", dst = "/opt/bench" }]
[node]
command = ["/usr/bin/true"]
seccomp = "$BENCH/pol/node.json"
landlock = "$BENCH/pol/node.toml"
scratch = "$d/ns"
credential = "$d/cred"
ro_binds = [{ src = "$BENCH/bin", dst = "/opt/bench" }]
$extra
TOML
  chmod 0644 "$d/c.toml"; [ "$mode" = rootless ] && chown 65534 "$d/c.toml" || true
}

BWRAP="bwrap --unshare-all --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev"

# The real engine benchmarks (inference.sh, job.sh): llama-server, SmolLM2 and the Python venv,
# built or reused from their caches.
llm_env() {
  LLM=${SEALNODE_LLM_DIR:-/var/tmp/sealnode-llm}; PYD=${SEALNODE_TEST_CACHE:-/var/tmp/sealnode-test}
  # Both refuse a dir another user made (scripts/own-dir): nothing from one is run or sourced.
  "$REPO/scripts/build-llama-server" "$LLM" >/dev/null || exit 1; . "$LLM/env"
  "$REPO/scripts/prepare-python" "$PYD" >/dev/null || exit 1; . "$PYD/env"
}

# $1 = dir, $2 = the node's argv (JSON list), $3 = TOML appended to [node]: a rootful fixture
# whose engine is llama-server -t 1 on 127.0.0.1:18080 serving SmolLM2, and whose node is a
# program of the venv (the interpreter bound at the prefix the venv names).
write_llama_fixture() {
  local d=$1
  write_fixture "$d" rootful
  ln -f "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf" 2>/dev/null || cp "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf"
  python3 - "$d/c.toml" "$(dirname "$SEALNODE_TEST_LLAMA_SERVER")" "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX" "$SEALNODE_TEST_VENV" "$2" "$3" <<'PY'
import sys
p, bindir, pycopy, prefix, venv, node, extra = sys.argv[1:]
s = open(p).read()
engine = '["/opt/llama/llama-server", "-m", "/models/smollm2.gguf", "--host", "127.0.0.1", "--port", "18080", "-t", "1", "-c", "2048"]'
a, b = s.split('command = ["/usr/bin/true"]', 1)
b = b.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
s = a + 'command = ' + engine + b
s = s.replace('ro_binds = [{ src = "', f'ready = {{ kind = "http", path = "/health", timeout_s = 120 }}\nro_binds = [{{ src = "{bindir}", dst = "/opt/llama" }}, {{ src = "', 1)
node_binds = f'ro_binds = [{{ src = "{pycopy}", dst = "{prefix}" }}, {{ src = "{venv}" }}, {{ src = "'
i = s.index('[node]')
s = s[:i] + s[i:].replace('ro_binds = [{ src = "', node_binds, 1)
s += '\n' + extra + '\n'
open(p, 'w').write(s)
PY
}

# The bare engine: llama-server -t 1 on 127.0.0.1:18181, once it answers /health. Sets $bare_pid.
start_bare_llama() {
  "$SEALNODE_TEST_LLAMA_SERVER" -m "$SEALNODE_TEST_MODEL" --host 127.0.0.1 --port 18181 -t 1 -c 2048 >/dev/null 2>&1 &
  bare_pid=$!
  for _ in $(seq 1 300); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18181/health 2>/dev/null | grep -q 200 && break; sleep 0.1; done
}

# $1 = hyperfine's --export-json file, $2 = the anchor's name (its first command): a markdown
# table of medians, min, max and each command's ratio to the anchor.
hyperfine_table() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
base = r[0]["median"]
print(f"| command | median | min | max | vs {sys.argv[2]} |")
print("|---|---:|---:|---:|---:|")
for x in r:
    print(f"| {x['command']} | {x['median']*1000:.1f} ms | {x['min']*1000:.1f} ms | {x['max']*1000:.1f} ms | {x['median']/base:.3f}x |")
PY
}

# Time the commands of the array `cmds` (name, command, name, command, ...) in $ROUNDS rounds of
# $RUNS runs each, pinned to $CPU, the order rotated every round (so none always runs first or
# after the same one), then print report.py's table against the anchor.
# $1 = the JSON files' prefix under $out, $2 = warm-up runs, $3 = the anchor's name.
rotating_rounds() {
  local prefix=$1 warmup=$2 anchor=$3 files=() r k i n args
  for r in $(seq 1 "$ROUNDS"); do
    args=()
    n=$(( ${#cmds[@]} / 2 ))
    for k in $(seq 0 $((n - 1))); do
      i=$(( (k + r) % n ))   # rotate the order every round
      args+=(-n "${cmds[$((2 * i))]}" "${cmds[$((2 * i + 1))]}")
    done
    taskset -c "$CPU" hyperfine -N -w "$warmup" -r "$RUNS" --style none --export-json "$out/$prefix-$r.json" "${args[@]}" >/dev/null
    files+=("$out/$prefix-$r.json")
  done
  python3 "$REPO/bench/report.py" "$anchor" "${files[@]}"
}
