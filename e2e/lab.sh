#!/usr/bin/env bash
# The lab on this machine (as root): `bash e2e/lab.sh up` builds a simulated cluster in network
# namespaces (an edge node, two workers, the example classes), runs the controller and one executor
# per node, and shows a client reaching a pod on another node with its real address. Any other
# kuport-lab command works the same way: status, probe, exec, apply, down.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/deps.sh
. e2e/deps.sh
# shellcheck source=e2e/progress.sh
. e2e/progress.sh
# Compiling shows its progress (README: the Rust workspace takes about 7 minutes cold here).
progress -q "lab: compiling kuport-lab" "about 7 min cold, seconds warm" \
  cargo build --locked -p kuport-lab --bin kuport-lab
exec "$CARGO_TARGET_DIR/debug/kuport-lab" "$@"
