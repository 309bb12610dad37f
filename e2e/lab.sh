#!/usr/bin/env bash
# The lab on this machine (as root): `bash e2e/lab.sh up` builds a simulated cluster in network
# namespaces (an edge node, two workers, the example classes), runs the controller and one executor
# per node, and shows a client reaching a pod on another node with its real address. Any other
# kuport-lab command works the same way: status, probe, exec, apply, down.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/deps.sh
. e2e/deps.sh
exec cargo run --quiet --locked -p kuport-lab -- "$@"
