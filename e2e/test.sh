#!/usr/bin/env bash
# Runs every test kuport has, on a fresh machine (as root). Idempotent: installs what is missing,
# reuses what an earlier run built (${KUPORT_CACHE:-~/.cache/kuport}).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages (nft, ip), and the shared build cache.
. e2e/deps.sh
# Long steps print what they do, a heartbeat every 10 s and their time (e2e/progress.sh).
. e2e/progress.sh

start=$(date +%s)
# The lab's control plane: etcd, kube-apiserver, kubectl and helm built from the Go module proxy
# (about 30 minutes cold on two cores, cached in $cache/bin), started and exercised once.
bash e2e/controlplane/smoke.sh
# The Helm chart: lint, golden renders, RBAC checks, install/upgrade/uninstall on the lab's API server.
bash e2e/chart/test.sh
# A real node: the kubelet with containerd and the bridge CNI, joined to the lab's API server, runs
# a pod (e2e/README.md, "A real node"). A root test: KUPORT_SKIP_ROOT_TESTS=1 skips it.
if [ "${KUPORT_SKIP_ROOT_TESTS:-}" != 1 ]; then
  progress "test: a real kubelet node" "13-22 s warm; the first run builds the kubelet, controller manager and scheduler (about 8 min after kube-apiserver)" \
    bash e2e/realnode/smoke.sh
fi

cargo fmt --all -- --check
progress "test: clippy" "minutes cold, under a minute warm" \
  cargo clippy --workspace --all-targets --locked -- -D warnings
# Compiled first, so the build shows its progress; the run then starts at once.
progress "test: compiling the tests" "7-10 min cold, seconds warm" \
  cargo test --workspace --locked --no-run
cargo test --workspace --locked --no-fail-fast
# The chart's RBAC with the real controller (the binary cargo test just built): enough, and each grant needed.
bash e2e/chart/rbac.sh
# The kernel WireGuard backend against the real wireguard.ko: Debian's kernel under QEMU runs
# node-exec's WireGuard root tests, and their ablation, which must fail (docs/overlay/node.md,
# "Proven in a real kernel"). A root test: KUPORT_SKIP_ROOT_TESTS=1 skips it.
if [ "${KUPORT_SKIP_ROOT_TESTS:-}" != 1 ]; then
  progress "test: kernel WireGuard in a VM" "about 45 s warm; cold, 40 s more for the kernel and minutes to build the ablation" bash e2e/vm/wireguard.sh
  # Both images built from Containerfile on bases from Debian packages, run by podman as the
  # chart runs them; users, capabilities and read-only roots checked (docs/container.md).
  progress "test: the images" "30-50 s warm; cold, about 30 s more for podman, the bases and the images" bash e2e/container/images.sh
  # The chart on the real node with those images (their OCI archives): helm install on the
  # kubelet, a PortMap and an Intercept on real pods, then removal and uninstall (e2e/README.md,
  # "The chart on the real node").
  progress "test: the chart on a real node" "30-50 s warm" bash e2e/realnode/chart.sh
fi
echo "all tests finished in $(( $(date +%s) - start ))s"
