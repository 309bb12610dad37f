#!/usr/bin/env bash
# Runs every test kuport has, on a fresh machine (as root). Idempotent: installs what is missing,
# reuses what an earlier run built (${KUPORT_CACHE:-~/.cache/kuport}).
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${KUPORT_CACHE:-$HOME/.cache/kuport}
mkdir -p "$cache"

# Debian packages the root tests use as their oracle: nft and ip.
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Built artefacts live outside the clone, so a clean clone reuses them.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
export CARGO_TERM_COLOR=never

start=$(date +%s)
# The lab's control plane: etcd, kube-apiserver, kubectl and helm built from the Go module proxy
# (about 30 minutes cold on two cores, cached in $cache/bin), started and exercised once.
bash e2e/controlplane/smoke.sh
# The Helm chart: lint, golden renders, RBAC checks, install/upgrade/uninstall on the lab's API server.
bash e2e/chart/test.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-fail-fast
echo "all tests finished in $(( $(date +%s) - start ))s"
