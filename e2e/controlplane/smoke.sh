#!/usr/bin/env bash
# Smoke test of the lab control plane: build, start, exercise the API the way
# kuport will (Nodes and Pods without a kubelet, pod status written through
# the status subresource, hand-made Service + EndpointSlice), stop.
# Prints "1 passed, 0 failed" on success (CI counts that line), else
# "0 passed, 1 failed" and exits non-zero.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/kuport-smoke.XXXXXX")"
rmdir "$STATE"   # up.sh wants a missing or empty dir; it creates it

log() { printf '[smoke] %s\n' "$*" >&2; }
finish() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    log "FAILED (exit $rc)"
    for l in etcd kube-apiserver; do
      [ -f "$STATE/$l.log" ] && { echo "----- $STATE/$l.log (tail)" >&2; tail -n 30 "$STATE/$l.log" >&2; }
    done
  fi
  [ -d "$STATE" ] && "$HERE/down.sh" "$STATE" || true
  if [ "$rc" = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
  exit "$rc"
}
trap finish EXIT

t0=$(date +%s)
BIN="$("$HERE/build.sh" | tail -n1)"
log "binaries ready in $(( $(date +%s) - t0 ))s: $BIN"

KCFG="$("$HERE/up.sh" "$STATE" | tail -n1)"
k() { "$BIN/kubectl" --kubeconfig "$KCFG" "$@"; }
expect() { # description actual expected
  if [ "$2" != "$3" ]; then log "ASSERTION FAILED: $1: got '$2', want '$3'"; exit 1; fi
  log "ok: $1 = $3"
}

k version -o json >/dev/null
expect "whoami" "$(k auth whoami -o jsonpath='{.status.userInfo.username}')" kuport-admin

k create namespace x

# A Node object; no kubelet exists, so we play the kubelet's part.
k apply -f - <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    kubernetes.io/hostname: node-a
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
EOF
k patch node node-a --subresource=status --type=merge -p '{"status":{
  "addresses":[{"type":"InternalIP","address":"192.168.50.10"},{"type":"Hostname","address":"node-a"}],
  "conditions":[{"type":"Ready","status":"True","reason":"KuportSmoke","message":"fake node",
                 "lastHeartbeatTime":"2024-01-01T00:00:00Z","lastTransitionTime":"2024-01-01T00:00:00Z"}]}}'
expect "node InternalIP" "$(k get node node-a -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')" 192.168.50.10

# A Pod bound to that node (nodeName set: no scheduler needed).
k apply -f - <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: x
  labels: {app: web}
spec:
  nodeName: node-a
  containers:
  - name: web
    image: registry.invalid/web:never-pulled
    ports: [{containerPort: 8080, name: http}]
EOF
k -n x patch pod web-0 --subresource=status --type=merge -p '{"status":{
  "phase":"Running","hostIP":"192.168.50.10","hostIPs":[{"ip":"192.168.50.10"}],
  "podIP":"10.244.1.5","podIPs":[{"ip":"10.244.1.5"}],
  "conditions":[{"type":"Ready","status":"True"}]}}'
expect "pod phase" "$(k -n x get pod web-0 -o jsonpath='{.status.phase}')" Running
expect "pod IP" "$(k -n x get pod web-0 -o jsonpath='{.status.podIP}')" 10.244.1.5

# A Service and a hand-made EndpointSlice (no endpointslice controller runs).
k apply -f - <<'EOF'
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: x
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-manual
  namespace: x
  labels:
    kubernetes.io/service-name: web
    endpointslice.kubernetes.io/managed-by: kuport-smoke
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-a
  targetRef: {kind: Pod, namespace: x, name: web-0}
EOF
cip="$(k -n x get svc web -o jsonpath='{.spec.clusterIP}')"
case "$cip" in 10.96.*) log "ok: service clusterIP $cip is in 10.96.0.0/16" ;;
  *) log "ASSERTION FAILED: service clusterIP '$cip' not in 10.96.0.0/16"; exit 1 ;; esac
expect "endpointslice address" \
  "$(k -n x get endpointslices -l kubernetes.io/service-name=web -o jsonpath='{.items[0].endpoints[0].addresses[0]}')" 10.244.1.5

k get nodes -o wide
k -n x get pods,services,endpointslices -o wide
log "smoke test finished in $(( $(date +%s) - t0 ))s"
