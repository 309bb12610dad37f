#!/usr/bin/env bash
# The real node end to end: up.sh, then one pod of the local test image (busybox httpd) on it,
# Running and Ready (the kubelet's HTTP probe) with an address from the bridge CNI, fetched from
# the node's namespace; the host's namespace unchanged; the times and the daemons' memory; then
# down.sh, and nothing left. Prints "N passed, M failed" last. Run as root.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LAB="${1:-${KUPORT_REALNODE_DIR:-${TMPDIR:-/tmp}/kuport-realnode-smoke}}"
pass=0 fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
now() { date +%s%N; }
ms() { echo $(( ($(now) - $1) / 1000000 )); }

host_net() { ip -o link show | awk '{print $2}' | sort; ip -o addr show | awk '{print $2, $4}' | sort; ip route show table all | sort; ip rule show | sort; nft list ruleset 2>/dev/null; }
before="$(host_net)"

t=$(now)
if ! env_file="$("$HERE/up.sh" "$LAB" | tail -n1)"; then
  bad "up.sh"
  "$HERE/down.sh" "$LAB" || true
  echo "$pass passed, $fail failed"
  exit 1
fi
ok "node Ready; up.sh took $(ms "$t") ms"
# shellcheck disable=SC1090
. "$env_file"
k() { kubectl "$@"; }

t=$(now)
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  nodeName: $KUPORT_REALNODE_NAME
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: kuport.local/testpod:lab
    imagePullPolicy: Never
    ports: [{containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
EOF
if k wait --for=condition=Ready pod/web --timeout=120s >/dev/null; then
  ok "pod web Ready $(ms "$t") ms after it was created"
else
  bad "pod web not Ready: $(k get pod web -o jsonpath='{.status}' 2>&1 | cut -c1-400)"
fi
ip="$(k get pod web -o jsonpath='{.status.podIP}')"
case "$ip" in 10.244.100.*) ok "pod address $ip from the bridge CNI's range" ;; *) bad "pod address '$ip'" ;; esac
if body="$(nsenter --net="/run/netns/$KUPORT_REALNODE_NETNS" curl -fsS --max-time 5 "http://$ip:8080/")" \
   && [ "$body" = "kuport realnode test pod" ]; then
  ok "the node's namespace reaches the pod: $body"
else
  bad "GET http://$ip:8080/ from the node's namespace: '$body'"
fi
if node ip -o link show cni0 >/dev/null 2>&1; then ok "cni0 is in the node's namespace"; else bad "no cni0 in the node's namespace"; fi

rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
kl="$(rss "$(cat "$KUPORT_REALNODE_DIR/kubelet.pid")")"
cd_="$(rss "$(cat "$KUPORT_REALNODE_DIR/containerd.pid")")"
kcm="$(rss "$(cat "$KUPORT_REALNODE_DIR/controller-manager.pid")")"
ks="$(rss "$(cat "$KUPORT_REALNODE_DIR/scheduler.pid")")"
shims=0
for p in $(pgrep -f containerd-shim-runc-v2 || true); do
  grep -q "$KUPORT_REALNODE_CGROUP" "/proc/$p/cgroup" 2>/dev/null && shims=$((shims + $(rss "$p")))
done
mem="$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ { print $2; exit }' /proc/self/mounts)"
echo "memory (RSS): kubelet $((kl / 1024)) MiB, containerd $((cd_ / 1024)) MiB, shims $((shims / 1024)) MiB," \
  "controller manager $((kcm / 1024)) MiB, scheduler $((ks / 1024)) MiB;" \
  "cgroup $KUPORT_REALNODE_CGROUP: $(( $(cat "$mem/$KUPORT_REALNODE_CGROUP/memory.usage_in_bytes" 2>/dev/null || echo 0) / 1048576 )) MiB with page cache"

if [ "$(host_net)" = "$before" ]; then ok "the host's links, addresses, routes, rules and nftables unchanged"; else bad "the host's network changed: $(diff <(echo "$before") <(host_net) | head -20)"; fi

t=$(now)
if "$HERE/down.sh" "$LAB"; then ok "down.sh: nothing left ($(ms "$t") ms)"; else bad "down.sh left something"; fi
if [ "$(host_net)" = "$before" ]; then ok "the host's network as before"; else bad "the host's network after down"; fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
