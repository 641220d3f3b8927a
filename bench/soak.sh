#!/usr/bin/env bash
# The real stack under faults (issue #29 item 6): one sealed stack, `sealnode run` with
# llama-server (SmolLM2, -t 1) as the engine and frutebox-node as the node, whose gateway is a
# benchmark stand-in (soak-gateway.py) keeping IN_FLIGHT jobs in flight for DURATION seconds.
# Meanwhile FAULTS faults, evenly spread, each once the cell has recovered from the one before:
# the engine's llama-server SIGKILLed, the node's frutebox-node SIGKILLed, a SIGHUP to sealnode
# (a reload, the config unchanged: both roles re-provisioned), `sealnode ctl recycle`, the
# engine's llama-server SIGSTOPped for 3 s, and two rollouts as a fleet pushes them (the config
# edited, then SIGHUP): a forwarder bound changed (applied in place, no role restarts) and a node
# setting changed (the node restarts alone beside the running engine). Then a
# report: jobs sent, answered and failed, in total and per fault kind (a job counts for a fault
# when it was in flight between the fault and GRACE_S seconds after the cell was ready again,
# the node registered with the gateway again where it restarts), and every failure's text.
# A node kill cuts the node's own jobs (its process dies): reported, not a target. The target:
# no failed job for an engine kill, a reload, a recycle or an engine stop.
# Kept in $BENCH/soak: jobs.jsonl (the gateway's log), faults.jsonl, sealnode.log (sealnode's
# log with the roles' output), status-end.json, report.md.
# Needs scripts/build-llama-server and scripts/prepare-python (their env files are sourced).
# shellcheck source=bench/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
DURATION=${DURATION:-600}; FAULTS=${FAULTS:-21}; IN_FLIGHT=${IN_FLIGHT:-2}; MAX_TOKENS=${MAX_TOKENS:-64}
GW=${GW_PORT:-18767}; HOLD=${ENGINE_HOLD_S:-30}; DRAIN=${DRAIN_TIMEOUT_S:-10}; GRACE=${GRACE_S:-5}
JOB_TIMEOUT=${JOB_TIMEOUT_S:-60}
llm_env
PY=$SEALNODE_TEST_VENV/bin/python
d=$BENCH/soak
sets=""
for kv in FRUTEBOX_ENGINE=llamacpp FRUTEBOX_LLAMACPP_HOST=http://127.0.0.1:18080 \
  FRUTEBOX_LLAMACPP_MAX_TOKENS="$MAX_TOKENS" FRUTEBOX_NODE_STATE_FILE=/scratch/state SOAK_ROLLOUT=0; do
  sets+="${kv%%=*} = \"${kv#*=}\", "
done
write_llama_fixture "$d" \
  "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$PY" -I -u -m frutebox.provider --id sealed \
    --gateway-url "ws://gateway.bench:$GW/provider/ws" --models smollm2 --compute-type cpu --memory-gb 2 --cpu-cores 1)" \
  "egress = [{ host = \"gateway.bench\", port = $GW, connect = \"127.0.0.1:$GW\" }]
env = { set = { ${sets%, } } }
restart = \"on-failure\""
# Both roles come back after a crash; the node's connections wait for a restarting engine, and
# a clean stop waits for the node's requests to the engine (docs/config.md).
sed -i -e "s/^\[cell\]\$/[cell]\nengine_hold_s = $HOLD\ndrain_timeout_s = $DRAIN\negress_idle_timeout_s = 600/" \
  -e "s/^\[engine\]\$/[engine]\nrestart = \"on-failure\"/" "$d/c.toml"
: > "$d/faults.jsonl"
pids=()
# shellcheck disable=SC2317  # called by the trap
cleanup() { kill "${pids[@]}" 2>/dev/null || true; [ -n "${sn:-}" ] && kill -TERM "$sn" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

now() { date +%s.%N; }
sleep_until() { sleep "$(awk -v a="$1" -v b="$(now)" 'BEGIN { d = a - b; print (d > 0 ? d : 0) }')"; }
# The cell as `ctl status` has it: ready, the engine's and the node's starts, the last reload's
# outcome and time (- - without one).
cell_state() {
  "$SN" ctl --config "$d/c.toml" status --json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
starts = {r["role"]: r["starts"] for r in s["roles"]}
r = s.get("reload") or {}
print(int(bool(s["ready"])), starts["engine"], starts["node"], int(bool(r.get("ok"))) if r else "-", r.get("at", "-"))' ||
    echo "0 -1 -1 - -"
}
# The gateway has the node: its last connection event is a registration.
gw_has_node() { grep '"ev": "conn"' "$d/jobs.jsonl" | tail -n 1 | grep -q '"registered"'; }
# The pid of the process under sealnode whose command line matches $1 (a role's workload, not
# its init, whose command line is sealnode's own).
workload_pid() {
  local p
  for p in $(ps -e -o pid=,ppid= | awk -v root="$sn" '{ parent[$1] = $2 }
      END { for (p in parent) { q = p; while (q in parent && q != root && q > 1) q = parent[q]; if (q == root && p != root) print p } }'); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -Eq "$1" && { echo "$p"; return; }
  done
  return 0
}
engine_pid() { workload_pid '^/opt/llama/llama-server '; }
node_pid() { workload_pid ' -m frutebox\.provider '; }

"$PY" -u "$REPO/bench/soak-gateway.py" --port "$GW" --duration "$DURATION" --in-flight "$IN_FLIGHT" \
  --job-timeout "$JOB_TIMEOUT" > "$d/jobs.jsonl" & gw=$!; pids+=("$gw")
SEALNODE_LOG=${SEALNODE_LOG:-debug} "$SN" run --config "$d/c.toml" > "$d/sealnode.log" 2>&1 & sn=$!
for _ in $(seq 1 3000); do grep -q '"ev": "start"' "$d/jobs.jsonl" && break; kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
grep -q '"ev": "start"' "$d/jobs.jsonl" || { echo "soak: the node never registered; see $d/sealnode.log" >&2; exit 1; }
t0=$(python3 -c 'import json, sys; print(next(json.loads(l)["t"] for l in open(sys.argv[1]) if "\"start\"" in l))' "$d/jobs.jsonl")
load0=$(cut -d' ' -f1-3 /proc/loadavg)

kinds=(engine-kill node-kill reload recycle engine-stop rollout-in-place rollout-node)
# A rollout: the config edited (toggled between two values, renamed over as config management
# writes it), then SIGHUP.
rollout() {  # SED-EXPRESSION
  sed -e "$1" "$d/c.toml" > "$d/c.toml.new" && mv "$d/c.toml.new" "$d/c.toml" && kill -HUP "$sn"
}
for i in $(seq 1 "$FAULTS"); do
  kind=${kinds[$(( (i - 1) % ${#kinds[@]} ))]}
  sleep_until "$(awk -v t="$t0" -v i="$i" -v n="$FAULTS" -v D="$DURATION" 'BEGIN { printf "%.3f", t + i * D / (n + 1) }')"
  # Each fault meets a recovered cell: ready, and the node registered with the gateway.
  late=0
  until [ "$(cell_state | cut -d' ' -f1)" = 1 ] && gw_has_node; do
    kill -0 "$sn" 2>/dev/null || { echo "soak: sealnode exited; see $d/sealnode.log" >&2; exit 1; }
    late=1; sleep 0.2
  done
  read -r _ e0 n0 _ _ <<< "$(cell_state)"
  detail=""; pid=""
  t=$(now)
  case $kind in
    engine-kill) pid=$(engine_pid); [ -n "$pid" ] && kill -KILL "$pid" ;;
    node-kill) pid=$(node_pid); [ -n "$pid" ] && kill -KILL "$pid" ;;
    reload) kill -HUP "$sn" ;;
    rollout-in-place) rollout 's/^egress_idle_timeout_s = 600$/egress_idle_timeout_s = 601/; t; s/^egress_idle_timeout_s = 601$/egress_idle_timeout_s = 600/' ;;
    rollout-node) rollout 's/SOAK_ROLLOUT = "0"/SOAK_ROLLOUT = "1"/; t; s/SOAK_ROLLOUT = "1"/SOAK_ROLLOUT = "0"/' ;;
    recycle) "$SN" ctl --config "$d/c.toml" recycle > "$d/recycle-$i.out" 2>&1 & rc_pid=$! ;;
    engine-stop) pid=$(engine_pid); [ -n "$pid" ] && { kill -STOP "$pid"; sleep 3; kill -CONT "$pid"; } ;;
  esac
  # Recovered: ready again, with the restarted roles started again (a refused reload: its
  # outcome logged), within 180 s.
  ready_t=null
  for _ in $(seq 1 900); do
    read -r rdy e1 n1 rok rat <<< "$(cell_state)"
    case $kind in
      engine-kill) done_=$(( e1 > e0 )) ;;
      node-kill) done_=$(( n1 > n0 )) ;;
      reload | recycle) done_=$(( e1 > e0 && n1 > n0 )) ;;
      rollout-node) done_=$(( n1 > n0 )) ;;
      rollout-in-place) done_=$([ "$rok" = 1 ] && [ "$rat" != - ] && awk -v a="$rat" -v t="$t" 'BEGIN { exit !(a >= int(t)) }' && echo 1 || echo 0) ;;
      *) done_=1 ;;
    esac
    if [ "${kind%%-*}" != engine ] && [ "$kind" != node-kill ] && [ "$kind" != recycle ] && [ "$rok" = 0 ] && [ "$rat" != - ] && awk -v a="$rat" -v t="$t" 'BEGIN { exit !(a >= int(t)) }'; then
      detail="reload refused: $("$SN" ctl --config "$d/c.toml" status --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["reload"]["error"])')"
      ready_t=$(now); break
    fi
    [ "$rdy" = 1 ] && [ "$done_" = 1 ] && { ready_t=$(now); break; }
    sleep 0.2
  done
  if [ "$kind" = recycle ]; then
    wait "$rc_pid" && detail="recycle: $(tr '\n' ' ' < "$d/recycle-$i.out")" || detail="recycle failed: $(tr '\n' ' ' < "$d/recycle-$i.out")"
  fi
  case $kind in
    engine-kill | node-kill | engine-stop) [ -z "$pid" ] && detail="no workload process found" ;;
    # What a rollout restarted, by the starts ctl status counts.
    rollout-*) read -r _ e1 n1 _ _ <<< "$(cell_state)"; detail="${detail:+$detail; }restarted: engine $((e1 - e0)), node $((n1 - n0))" ;;
  esac
  python3 -c 'import json, sys
i, kind, t, ready, pid, late, detail = sys.argv[1:]
print(json.dumps({"fault": int(i), "kind": kind, "t": float(t), "ready_t": None if ready == "null" else float(ready),
                  "pid": int(pid) if pid else None, "late": late == "1", "detail": detail}))' \
    "$i" "$kind" "$t" "$ready_t" "$pid" "$late" "$detail" >> "$d/faults.jsonl"
  echo "soak: fault $i/$FAULTS $kind at +$(awk -v a="$t" -v b="$t0" 'BEGIN { printf "%.1f", a - b }') s, ready again after $(awk -v a="$ready_t" -v b="$t" 'BEGIN { printf "%.1f", a - b }') s $detail" >&2
done
wait "$gw" || true
"$SN" ctl --config "$d/c.toml" status --json > "$d/status-end.json" 2>/dev/null || true
load1=$(cut -d' ' -f1-3 /proc/loadavg)
kill -TERM "$sn" 2>/dev/null; wait "$sn" 2>/dev/null || true; sn=""
"$PY" "$REPO/bench/soak-report.py" "$d" "$GRACE" \
  "engine_hold_s = $HOLD, drain_timeout_s = $DRAIN, stop_timeout_s = 2, restart = on-failure (both roles); $IN_FLIGHT jobs in flight, job timeout $JOB_TIMEOUT s, FRUTEBOX_LLAMACPP_MAX_TOKENS=$MAX_TOKENS; load average $load0 at the start, $load1 at the end" |
  tee "$d/report.md"
