#!/usr/bin/env bash
# Run every benchmark and print one markdown report (docs/performance.md keeps the latest).
#   sudo ./bench/all.sh > /tmp/perf.md
set -euo pipefail
cd "$(dirname "$0")"
echo "Machine: $(nproc) vCPU, $(uname -r), $(date -u +%Y-%m-%d)"
echo
./launch.sh
./launch-phases.sh
./start.sh
./syscalls.sh
echo
taskset -c "${SEALNODE_BENCH_CPU:-1}" ./egress.sh | sed 's/^### egress: /### egress, latency run pinned to one CPU: /'
echo
./egress.sh | sed 's/^### egress: /### egress, unpinned (throughput): /'
echo
taskset -c "${SEALNODE_BENCH_CPU:-1}" ./engine-hop.sh | sed 's/^### node -> engine: /### node -> engine, pinned to one CPU: /'
echo
./footprint.sh
./digests.sh
./gate.sh
./attest.sh
./inference.sh
./job.sh
