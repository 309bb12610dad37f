#!/usr/bin/env bash
# The chart on a real node: `helm install` of charts/kuport on the real-node lab (up.sh), with
# kuport's two images (e2e/container/images.sh's OCI archives) imported into the node's
# containerd, then real packets and real pods:
#   - every kuport pod Ready: the controller Deployment (2 replicas) and the executor DaemonSet,
#     as the kubelet runs them (projected token, the CA ConfigMap, the state hostPath, the
#     capabilities, hostNetwork, hostPID and the CRI socket of interception);
#   - the executor in the node's own network namespace (never the host's), connected with its
#     pod-bound token, and synced (kuportctl nodes: desired = acknowledged);
#   - a PortMap publishes TCP 20080 of the node to a pod behind a Service (EndpointSlice made by
#     the controller manager): a client in its own namespace, joined to the node by a veth, dials
#     the node's address and the pod answers with the client's own address;
#   - an Intercept on another pod: the executor finds the pod's network namespace through the
#     real CRI (containerd), the table `kuport-intercept` is in the pod's namespace (entered by
#     one of the pod's processes, found by its cgroup), and a connection to the app's port is
#     steered to the agent's;
#   - removal: the Intercept deleted, its table leaves the pod; then, with the Intercept back and
#     the PortMap in place, `helm uninstall` alone: its pre-delete hook (kuportctl teardown)
#     empties the node's state and waits for the acknowledgement, and no kuport table, kup-* link
#     or kuport rule is left in the node's namespace or the pod's; the node's tables, links and
#     rules are those it had before the install (docs/operations/uninstall.md);
#   - the host's links, addresses, routes, rules and nftables unchanged; down.sh leaves nothing.
# Prints "N passed, M failed" last. Run as root, after the images are built:
#   bash e2e/container/images.sh && bash e2e/realnode/chart.sh [LAB_DIR]
# Environment: KUPORT_IMAGE_DIR (the archives; default $KUPORT_CACHE/container), KUPORT_CTL_BIN
# (kuportctl; default $CARGO_TARGET_DIR/debug/kuportctl, built when missing).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LAB="${1:-${KUPORT_REALNODE_DIR:-${TMPDIR:-/tmp}/kuport-realnode-chart}}"
CACHE="${KUPORT_CACHE:-$HOME/.cache/kuport}"
IMAGES="${KUPORT_IMAGE_DIR:-$CACHE/container}"
VERSION="$(awk '/^appVersion:/ { gsub(/"/, "", $2); print $2 }' "$ROOT/charts/kuport/Chart.yaml")"
NS=kuport-system
# No kube-proxy and no cluster DNS: the executors dial the controller at a lab address that the
# node's krn-services table leads to a Ready replica (a follower names the leader).
CONTROLLER_VIP=10.250.0.10
PORT=20080

pass=0 fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
now() { date +%s%N; }
ms() { echo $(( ($(now) - $1) / 1000000 )); }
# until_ok SECONDS CMD...: CMD until it succeeds, every 0.25 s; false after SECONDS.
until_ok() {
  local end=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < end )) || return 1
    sleep 0.25
  done
}

[ "$(id -u)" = 0 ] || { echo "chart.sh needs root" >&2; exit 1; }
archives() { [ -f "$IMAGES/kuport-controller-$VERSION.oci.tar" ] && [ -f "$IMAGES/kuport-node-exec-$VERSION.oci.tar" ]; }
if ! archives && [ -z "${KUPORT_IMAGE_DIR:-}" ] && [ -f "$ROOT/e2e/container/images.sh" ]; then
  bash "$ROOT/e2e/container/images.sh" >&2 || { echo "e2e/container/images.sh failed" >&2; exit 1; }
fi
archives || { echo "no kuport-{controller,node-exec}-$VERSION.oci.tar in $IMAGES: build the images first (bash e2e/container/images.sh)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
KUPORTCTL="${KUPORT_CTL_BIN:-$CARGO_TARGET_DIR/debug/kuportctl}"
if [ ! -x "$KUPORTCTL" ]; then
  (cd "$ROOT" && cargo build -p kuport-controller --bin kuportctl --locked >&2) || { echo "cannot build kuportctl" >&2; exit 1; }
fi

host_net() { ip -o link show | awk '{print $2}' | sort; ip -o addr show | awk '{print $2, $4}' | sort; ip route show table all | sort; ip rule show | sort; nft list ruleset 2>/dev/null; }
before="$(host_net)"
T0=$(now)

CLIENT=""
finish() {
  [ -n "$CLIENT" ] && ip netns del "$CLIENT" 2>/dev/null
  if [ "$fail" != 0 ] && [ -n "${KUPORT_REALNODE_DIR:-}" ]; then
    for f in "$KUPORT_REALNODE_DIR"/root/var/log/pods/"$NS"_*/*/0.log; do
      [ -f "$f" ] && { echo "----- $f (tail)"; tail -n 15 "$f" | cut -c1-400; }
    done
  fi
  local t
  t=$(now)
  if "$HERE/down.sh" "$LAB"; then ok "down.sh: nothing left ($(ms "$t") ms)"; else bad "down.sh left something"; fi
  if [ "$(host_net)" = "$before" ]; then ok "the host's network as before"; else bad "the host's network after down"; fi
  echo "chart.sh took $(ms "$T0") ms"
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}
trap 'finish; exit $?' EXIT

t=$(now)
if ! env_file="$("$HERE/up.sh" "$LAB" | tail -n1)"; then
  bad "up.sh"
  exit 1
fi
ok "node Ready with a controller manager and a scheduler; up.sh took $(ms "$t") ms"
# shellcheck disable=SC1090
. "$env_file"
k() { kubectl "$@"; }
ID="${KUPORT_REALNODE_NETNS#krn-}"

# The node's kernel as kuport found it: nftables tables, links and rules. Not the links that
# pods and this test change: the pods' veths, the CNI's cni0 (made for the first pod) and
# "uplink" (moved to the client below).
node_net() {
  node nft list tables | sort
  node ip -o link show | awk '{print $2}' | sed 's/@.*//; s/:$//' | grep -vE '^(veth.*|cni0|uplink)$' | sort
  node ip rule show | sort
}
node_before="$(node_net)"

# ------------------------------------------------------------------ images and helm install
t=$(now)
for img in controller node-exec; do
  nodectr images import "$IMAGES/kuport-$img-$VERSION.oci.tar" >/dev/null || bad "import kuport-$img"
done
ok "images localhost/kuport-controller:$VERSION and localhost/kuport-node-exec:$VERSION imported ($(ms "$t") ms)"

t=$(now)
if helm install kuport "$ROOT/charts/kuport" -n "$NS" --create-namespace \
    --set controller.image.repository=localhost/kuport-controller \
    --set nodeExec.image.repository=localhost/kuport-node-exec \
    --set nodeExec.controllerAddress="https://$CONTROLLER_VIP:9443" \
    --set interception.enabled=true >/dev/null 2>"$LAB/helm.err"; then
  ok "helm install ($(ms "$t") ms)"
else
  bad "helm install: $(grep -v 'unrecognized format' "$LAB/helm.err" | head -5)"
  exit 1
fi
ctrl_ready() { [ "$(k -n "$NS" get pods -l app.kubernetes.io/component=controller -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}')" = "True True " ]; }
if until_ok 120 ctrl_ready; then
  ok "both controller replicas Ready $(ms "$t") ms after the install"
else
  bad "controller replicas not Ready: $(k -n "$NS" get pods -o wide 2>&1)"
  exit 1
fi
ctrl_ip="$(k -n "$NS" get pods -l app.kubernetes.io/component=controller -o jsonpath='{.items[0].status.podIP}')"
krn_service "$CONTROLLER_VIP:9443" "$ctrl_ip:9443"

exec_pod() { k -n "$NS" get pods -l app.kubernetes.io/component=node-exec -o jsonpath='{.items[0].metadata.name}'; }
exec_ready() { [ "$(k -n "$NS" get pods -l app.kubernetes.io/component=node-exec -o jsonpath='{.items[0].status.conditions[?(@.type=="Ready")].status}')" = True ]; }
if until_ok 60 exec_ready; then ok "executor $(exec_pod) Ready $(ms "$t") ms after the install"; else bad "executor not Ready: $(k -n "$NS" get pods -o wide 2>&1)"; fi
if [ "$(k -n "$NS" get pods --no-headers 2>/dev/null | wc -l)" = 3 ] \
   && ! k -n "$NS" get pods -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -v True >/dev/null; then
  ok "every kuport pod Ready (2 controllers, 1 executor)"
else
  bad "kuport pods: $(k -n "$NS" get pods 2>&1)"
fi

# The executor's process: in the node's network namespace, the host's PID namespace.
exec_pid=""
for p in $(pgrep -x kuport-node-exe 2>/dev/null; pgrep -f '^/usr/local/bin/kuport-node-exec run' 2>/dev/null); do
  grep -q "$KUPORT_REALNODE_CGROUP" "/proc/$p/cgroup" 2>/dev/null && { exec_pid=$p; break; }
done
if [ -n "$exec_pid" ] && [ "$(stat -L -c %i "/proc/$exec_pid/ns/net")" = "$(stat -L -c %i "/run/netns/$KUPORT_REALNODE_NETNS")" ] \
   && [ "$(stat -L -c %i "/proc/$exec_pid/ns/net")" != "$(stat -L -c %i /proc/self/ns/net)" ]; then
  ok "the executor (pid $exec_pid) runs in the node's network namespace $KUPORT_REALNODE_NETNS, not the host's"
else
  bad "the executor's network namespace (pid '${exec_pid}')"
fi

# The kubelet ran them as the chart says: the controllers as 65532, the executor as root with
# exactly NET_ADMIN, SYS_ADMIN and SYS_PTRACE (interception on) effective.
field() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$2/status" 2>/dev/null; }
ctrl_uids=""
for p in $(pgrep -f '^/usr/local/bin/kuport-controller run' 2>/dev/null); do
  grep -q "$KUPORT_REALNODE_CGROUP" "/proc/$p/cgroup" 2>/dev/null && ctrl_uids+="$(field Uid "$p") "
done
[ "$ctrl_uids" = "65532 65532 " ] && ok "both controller processes run as uid 65532" || bad "controller uids: '$ctrl_uids'"
caps="$(field CapEff "$exec_pid")"
[ "$(field Uid "$exec_pid")" = 0 ] && [ "$caps" = 0000000000281000 ] \
  && ok "the executor runs as root with CapEff $caps (NET_ADMIN, SYS_PTRACE, SYS_ADMIN)" \
  || bad "the executor's uid $(field Uid "$exec_pid") and CapEff '$caps'"

# kuportctl as a user bound to the chart's debug ClusterRole, from the node's namespace.
k -n "$NS" create serviceaccount lab-debug >/dev/null
k create clusterrolebinding kuport-lab-debug --clusterrole=kuport-debug --serviceaccount="$NS:lab-debug" >/dev/null
# It finds the leader by the Lease and its CA in the ConfigMap kuport-ca (read as the lab's admin,
# through the node's relay), then dials the leader's pod address: only the leader has streams.
ctl() { node env KUBECONFIG="$KUPORT_REALNODE_DIR/etc/admin.kubeconfig" "$KUPORTCTL" -n "$NS" --token "$(k -n "$NS" create token lab-debug)" "$@"; }
# NODE EXECUTOR DESIRED ACKED SYNCED ...
synced() { ctl nodes 2>/dev/null | awk -v n="$KUPORT_REALNODE_NAME" '$1 == n && $2 == "connected" && $3 == $4 && $5 == "yes" { f = 1 } END { exit !f }'; }
if until_ok 60 synced; then
  ok "the executor connected (projected token, CA ConfigMap) and synced $(ms "$t") ms after the install: $(ctl nodes | awk -v n="$KUPORT_REALNODE_NAME" '$1 == n')"
else
  bad "the executor is not synced: $(ctl nodes 2>&1)"
fi
if [ -s "$KUPORT_REALNODE_DIR/root/var/lib/kuport/applied.pb" ]; then
  ok "its state kept in the hostPath /var/lib/kuport (the node's $KUPORT_REALNODE_DIR/root/var/lib/kuport)"
else
  bad "no applied state in the node's /var/lib/kuport"
fi

# ------------------------------------------------------------------ a PortMap to a real pod
t=$(now)
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: kuport.local/testpod:lab
        imagePullPolicy: IfNotPresent
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: lab}
spec:
  nodes:
    $KUPORT_REALNODE_NAME: {interfaces: [eth0]}
  returnPath: {mode: None}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: web, namespace: web}
spec:
  className: lab
  protocol: TCP
  port: $PORT
  serviceRef: {name: web, port: http}
EOF
programmed() { [ "$(k -n web get portmap web -o jsonpath='{.status.conditions[?(@.type=="Programmed")].status}')" = True ]; }
if until_ok 90 programmed; then
  ok "PortMap web/web Programmed $(ms "$t") ms after it was applied, to $(k -n web get portmap web -o jsonpath='{.status.endpoint.address} on {.status.endpoint.node}')"
else
  bad "PortMap not Programmed: $(k -n web get portmap web -o jsonpath='{.status}' 2>&1 | cut -c1-600)"
fi
if k -n web get endpointslices -l kubernetes.io/service-name=web -o jsonpath='{.items[0].endpoints[0].targetRef.kind}' 2>/dev/null | grep -x Pod >/dev/null; then
  ok "its Service's EndpointSlice made by the controller manager"
else
  bad "no EndpointSlice for Service web/web"
fi

# The client: the node's "uplink" moved into a namespace of its own, 10.250.0.1 (the node's
# default gateway), dialing the node's address.
CLIENT="krc-$ID"
ip netns add "$CLIENT"
ip -n "$KUPORT_REALNODE_NETNS" link set uplink netns "$CLIENT"
ip -n "$CLIENT" link set lo up
ip -n "$CLIENT" addr add 10.250.0.1/24 dev uplink
ip -n "$CLIENT" link set uplink up
client_get() { ip netns exec "$CLIENT" curl -fsS --max-time 3 "http://$KUPORT_REALNODE_IP:$PORT$1"; }
seen=""
for _ in $(seq 1 20); do seen="$(client_get /cgi-bin/addr 2>/dev/null)" && break; sleep 0.25; done
case "$seen" in
  10.250.0.1|'[::ffff:10.250.0.1]') ok "the client dials $KUPORT_REALNODE_IP:$PORT; the pod sees the client's own address ($seen)" ;;
  *) bad "through the PortMap the pod saw '$seen', not the client's 10.250.0.1" ;;
esac

# ------------------------------------------------------------------ an Intercept through the CRI
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: icpt, namespace: web, labels: {app: icpt}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: kuport.local/testpod:lab
    imagePullPolicy: IfNotPresent
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
  - name: agent
    image: kuport.local/testpod:lab
    imagePullPolicy: IfNotPresent
    command: [/bin/httpd, -f, -p, "9900", -h, /agent]
EOF
k -n web wait --for=condition=Ready pod/icpt --timeout=60s >/dev/null || bad "pod web/icpt not Ready"
icpt_ip="$(k -n web get pod icpt -o jsonpath='{.status.podIP}')"
icpt_uid="$(k -n web get pod icpt -o jsonpath='{.metadata.uid}')"
# The pod's sandbox process (pause, in the cgroup the kubelet names after the pod's UID): the
# oracle's way into the pod's namespace, independent of the CRI the executor asks.
icpt_pid=""
for f in $(grep -l "pod$icpt_uid" /proc/[0-9]*/cgroup 2>/dev/null); do
  p="$(cut -d/ -f3 <<<"$f")"
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = pause ] && { icpt_pid=$p; break; }
done
in_pod() { nsenter -t "$icpt_pid" -n -- "$@"; }
body="$(node curl -fsS --max-time 3 "http://$icpt_ip:8080/" 2>&1)"
[ "$body" = "kuport realnode test pod" ] && ok "before the Intercept, $icpt_ip:8080 is the app" || bad "before the Intercept: '$body'"
t=$(now)
# The Intercept on pod web/icpt: its port 8080 steered to the agent's 9900.
apply_intercept() {
  k apply -f - >/dev/null <<EOF
apiVersion: kuport.wlz.li/v1alpha1
kind: Intercept
metadata: {name: icpt, namespace: web}
spec:
  podSelector: {matchLabels: {app: icpt}}
  intercepts:
    - {protocol: TCP, containerPort: 8080, agentPort: 9900}
  agent: {group: 7439}
EOF
}
apply_intercept
icpt_programmed() { [ "$(k -n web get intercept icpt -o jsonpath='{.status.conditions[?(@.type=="Programmed")].status}')" = True ]; }
if until_ok 60 icpt_programmed; then ok "Intercept web/icpt Programmed $(ms "$t") ms after it was applied"; else bad "Intercept not Programmed: $(k -n web get intercept icpt -o jsonpath='{.status}' 2>&1 | cut -c1-600)"; fi
icpt_table() { in_pod nft list table ip kuport-intercept | grep 'tcp . 8080 .*: 9900' >/dev/null; }
if [ -n "$icpt_pid" ] && until_ok 10 icpt_table; then
  ok "table ip kuport-intercept in the pod's own namespace (entered through its pid $icpt_pid): tcp 8080 to 9900"
else
  bad "no kuport-intercept table in pod web/icpt's namespace (pid '$icpt_pid')"
fi
exec_log="$(cat "$KUPORT_REALNODE_DIR"/root/var/log/pods/"$NS"_"$(exec_pod)"_*/node-exec/0.log 2>/dev/null)"
if grep 'pod network namespace named by the runtime' <<<"$exec_log" | grep '"pod":"web/icpt"' >/dev/null; then
  ok "the executor found the pod's namespace through containerd's CRI ($(grep 'named by the runtime' <<<"$exec_log" | grep -o '"netns":"[^"]*"' | head -n1))"
else
  bad "the executor did not name pod web/icpt's namespace through the CRI: $(grep -i 'icpt\|cri' <<<"$exec_log" | tail -n 3)"
fi
body="$(node curl -fsS --max-time 3 "http://$icpt_ip:8080/" 2>&1)"
[ "$body" = agent ] && ok "a connection to $icpt_ip:8080 is steered to the agent on 9900" || bad "with the Intercept, $icpt_ip:8080 answered '$body', not the agent"

# ------------------------------------------------------------------ removal, then uninstall
t=$(now)
k -n web delete intercept icpt >/dev/null
no_icpt_table() { ! in_pod nft list table ip kuport-intercept; }
if until_ok 30 no_icpt_table; then ok "Intercept deleted: the pod's table removed ($(ms "$t") ms)"; else bad "the pod's kuport-intercept table outlived its Intercept"; fi
body="$(node curl -fsS --max-time 3 "http://$icpt_ip:8080/" 2>&1)"
[ "$body" = "kuport realnode test pod" ] && ok "$icpt_ip:8080 is the app again" || bad "after the Intercept: '$body'"

# The Intercept again, and the PortMap still in place: what the uninstall must remove.
apply_intercept
if until_ok 30 icpt_table && until_ok 30 synced && client_get / >/dev/null 2>&1; then
  ok "before the uninstall: the Intercept's table in the pod again, the PortMap answering, the node synced"
else
  bad "before the uninstall: table $(in_pod nft list tables 2>&1 | tr '\n' ' '), $(ctl nodes 2>&1 | tail -n1)"
fi

# helm uninstall alone: its pre-delete hook (kuportctl teardown, a Job from the controller's
# image) empties every node's state and waits for the acknowledgements before Helm deletes
# anything (docs/operations/uninstall.md).
t=$(now)
rm -f "$LAB/uninstall.done" "$LAB/teardown.log"
# The hook's output, copied while its pod's log exists (Helm deletes the Job once it succeeded).
(
  while [ ! -f "$LAB/uninstall.done" ]; do
    for f in "$KUPORT_REALNODE_DIR"/root/var/log/pods/"$NS"_kuport-teardown-*/teardown/0.log; do
      [ -s "$f" ] && cp "$f" "$LAB/teardown.log.tmp" 2>/dev/null && mv "$LAB/teardown.log.tmp" "$LAB/teardown.log"
    done
    sleep 0.2
  done
) &
hook_copy=$!
if helm uninstall kuport -n "$NS" --wait >"$LAB/uninstall.out" 2>&1 && until_ok 60 sh -c "[ -z \"\$(kubectl -n $NS get pods -o name 2>/dev/null)\" ]"; then
  ok "helm uninstall, its teardown hook included: every kuport pod gone ($(ms "$t") ms)"
else
  bad "helm uninstall: $(tail -n 5 "$LAB/uninstall.out") $(k -n "$NS" get pods,jobs 2>&1)"
fi
touch "$LAB/uninstall.done"
wait "$hook_copy"
said="$(grep -o "$KUPORT_REALNODE_NAME: .*" "$LAB/teardown.log" 2>/dev/null | head -n1)"
if [ "$said" = "$KUPORT_REALNODE_NAME: empty, acknowledged" ]; then
  ok "the hook's kuportctl teardown said '$said'"
else
  bad "the hook's kuportctl teardown said '$said': $(tail -n 5 "$LAB/teardown.log" 2>&1)"
fi
if client_get / >/dev/null 2>&1; then bad "the port still answers after the uninstall"; else ok "after the uninstall the client's connection to $PORT fails"; fi
leftovers="$(node nft list tables | grep ' kuport'; node ip -o link show | awk '{print $2}' | grep '^kup-'; node ip rule show | grep -E '^10[12]:|0x6b70')"
[ -z "$leftovers" ] && ok "no kuport table, kup-* link or kuport rule in the node's namespace" || bad "left in the node: $leftovers"
in_pod nft list tables 2>/dev/null | grep kuport >/dev/null && bad "a kuport table left in pod web/icpt" || ok "no kuport table in pod web/icpt's namespace"
if [ "$(node_net)" = "$node_before" ]; then
  ok "the node's tables, links and rules as before the install"
else
  bad "the node's network changed: $(diff <(echo "$node_before") <(node_net) | head -20)"
fi
if [ "$(host_net)" = "$before" ]; then ok "the host's links, addresses, routes, rules and nftables unchanged"; else bad "the host's network changed: $(diff <(echo "$before") <(host_net) | head -20)"; fi
