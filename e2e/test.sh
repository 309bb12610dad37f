#!/usr/bin/env bash
# Runs every test kuport has, on a fresh machine (as root). Idempotent: installs what is missing,
# reuses what an earlier run built (${KUPORT_CACHE:-~/.cache/kuport}).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages (nft, ip), and the shared build cache.
. e2e/deps.sh

start=$(date +%s)
# The lab's control plane: etcd, kube-apiserver, kubectl and helm built from the Go module proxy
# (about 30 minutes cold on two cores, cached in $cache/bin), started and exercised once.
bash e2e/controlplane/smoke.sh
# The Helm chart: lint, golden renders, RBAC checks, install/upgrade/uninstall on the lab's API server.
bash e2e/chart/test.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-fail-fast
# The chart's RBAC with the real controller (the binary cargo test just built): enough, and each grant needed.
bash e2e/chart/rbac.sh
echo "all tests finished in $(( $(date +%s) - start ))s"
