#!/usr/bin/env bash
# Runs kuport's benchmarks (issue 8; docs/performance.md has every figure and the command for
# each one alone). Not part of e2e/test.sh: they take long and their numbers need a quiet machine.
#   bash e2e/bench.sh                 # all, in this order
#   bash e2e/bench.sh compute fanout  # some: apply compute mesh fanout datapath throughput latency overlay
# Needs root (network namespaces, nftables) for apply, datapath, throughput, latency and overlay.
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/deps.sh
# iperf3 (throughput), tcpdump (the MTU checks), conntrack (the datapath bench's flow counts).
extra=()
for tool in iperf3 tcpdump conntrack; do command -v $tool >/dev/null || extra+=($tool); done
if ((${#extra[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${extra[@]}" >/dev/null
fi
all=(apply compute mesh fanout datapath throughput latency overlay)
(($#)) || set -- "${all[@]}"
for b in "$@"; do
  case $b in
    apply | overlay) pkg=kuport-node-exec ;;
    compute | mesh | fanout) pkg=kuport-controller ;;
    datapath | throughput | latency) pkg=kuport-lab ;;
    *) echo "unknown benchmark $b (one of: ${all[*]})" >&2; exit 2 ;;
  esac
  echo "== $b: cargo bench -p $pkg --bench $b; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  cargo bench --locked -p "$pkg" --bench "$b"
done
