# Sourced by tests/vm/container.sh and bench/container-guest.sh: docs/containers.md's example
# config (the demo's stand-in engine, the real frutebox-node from the image's venv), written
# to FILE. Its paths are where the container's volumes put them; with HOST_DIR, the same files
# under HOST_DIR for a cell on the host (HOST_DIR/state, models, engine, node, cred, standin).
#
#   container_config FILE ID GATEWAY_HOST PORT CONNECT [HOST_DIR]
container_config() {
  h=${6:-}
  if [ -n "$h" ]; then
    state=$h/state models=$h/models escr=$h/engine nscr=$h/node cred=$h/cred/credential
    standin=$h/standin run=/run/sealnode-$2
  else
    state=/var/lib/sealnode models=/var/lib/sealnode-models escr=/var/lib/sealnode-scratch/engine
    nscr=/var/lib/sealnode-scratch/node cred=/etc/sealnode-credential/credential standin=/opt/standin
    run=/run/sealnode
  fi
  cat > "$1" <<TOML
# docs/containers.md's example: the demo's stand-in engine, the real frutebox-node.
schema = 1
[cell]
hostname = "$2"
state_dir = "$state"
runtime_dir = "$run"
rootful = { engine = "sealnode-engine", node = "sealnode-node" }
stop_timeout_s = 5
preflight_timeout_s = 180
[engine]
command = ["/opt/frutebox-node/bin/python", "-I", "-u", "/opt/standin/standin-engine.py", "--port", "11434"]
port = 11434
seccomp = "/usr/share/sealnode/seccomp/engine.json"
landlock = "/usr/share/sealnode/landlock-rules/engine.toml"
models = "$models"
scratch = "$escr"
ro_binds = [{ src = "/opt/frutebox-node" }, { src = "$standin", dst = "/opt/standin" }]
ready = { kind = "http", path = "/", timeout_s = 60 }
restart = "on-failure"
[node]
command = ["/opt/frutebox-node/bin/python", "-I", "-u", "-m", "frutebox.provider",
           "--id", "$2", "--gateway-url", "ws://$3:$4/provider/ws",
           "--models", "standin", "--compute-type", "cpu", "--memory-gb", "2", "--cpu-cores", "1",
           "--credential-file", "/run/sealnode/credential"]
seccomp = "/usr/share/sealnode/seccomp/node.json"
landlock = "/usr/share/sealnode/landlock-rules/node.toml"
scratch = "$nscr"
credential = "$cred"
ro_binds = [{ src = "/opt/frutebox-node" }]
egress = [{ host = "$3", port = $4, connect = "$5" }]
env = { set = { FRUTEBOX_ENGINE = "ollama", OLLAMA_HOST = "http://127.0.0.1:11434", FRUTEBOX_OLLAMA_MODEL = "standin", FRUTEBOX_NODE_STATE_FILE = "/scratch/frutebox_node_state" } }
restart = "on-failure"
TOML
  chmod 0644 "$1"
}
