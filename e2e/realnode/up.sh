#!/usr/bin/env bash
# A real node for the lab: kubelet (k8s.io/kubernetes/cmd/kubelet at the control plane's pin,
# built by e2e/controlplane/build.sh) with Debian's containerd, runc and the bridge CNI, joined
# to the lab's API server (e2e/controlplane/up.sh), with kube-controller-manager and
# kube-scheduler (the same pin) so that Deployments, DaemonSets, ServiceAccounts and
# EndpointSlices work as in a cluster. docs/decisions.md, "A real kubelet: on the host or in a
# VM", says why it runs on the host and what that costs.
#
# Usage: up.sh [LAB_DIR]     (default $KUPORT_REALNODE_DIR, else ${TMPDIR:-/tmp}/kuport-realnode)
# Prints LAB_DIR/env last (source it: KUBECONFIG, PATH, KUPORT_REALNODE_* and the `node` and
# `nodectr` functions, which run a command in the node's namespaces / ctr against its containerd).
#
# Contained, so that this machine's own namespaces get none of it:
#   - network: containerd, the kubelet and every hostNetwork pod live in the network namespace
#     `krn-<id>` (ip netns); its "eth0" (a veth whose peer stays inside) has the node address
#     10.250.0.2, the bridge CNI's cni0 (pods 10.244.100.0/24) is made there. The API server
#     stays on the host's 127.0.0.1: a socat in the namespace (0.0.0.0:6443) relays through a
#     unix socket to a socat on the host, so the host's namespace gets no link, address, route
#     or rule.
#   - files and mounts: both daemons share one private mount namespace (held by a `sleep`) in
#     which LAB_DIR/root/{run,var/lib,var/log} are bound over /run, /var/lib and /var/log. So
#     the standard paths (/run/containerd/containerd.sock, /var/lib/kubelet, /run/netns,
#     /var/lib/kuport...) are the lab's, hostPath volumes resolve there, and every mount the
#     runtime and the kubelet make (overlay roots, tmpfs volumes, pod namespaces) dies with it.
#   - processes: all of them (daemons, relays, shims, containers) in the cgroup
#     kuport-realnode-<id>, which is also the kubelet's cgroupRoot; down.sh kills that tree.
#   - Services: no kube-proxy and no cluster DNS. The node's nftables table `ip krn-services`
#     (a lab name, not kuport's) DNATs a map of Service addresses to endpoints, in prerouting
#     (pods) and output (the node and hostNetwork pods); up.sh puts the API server's
#     10.96.0.1:443 in it (to the relay below), `krn_service VIP:PORT ADDR:PORT` in LAB_DIR/env
#     adds more.
#   - sysctls: the kubelet sets six kernel-wide ones (vm.overcommit_memory, vm.panic_on_oom,
#     kernel.panic, kernel.panic_on_oops, kernel.keys.root_max{keys,bytes}) unless they already
#     hold its values; in the node's mount namespace files holding those values are bound over
#     them, so the host's stay as they are.
# What still touches the host: the cgroup directories (made here, removed by down.sh), the
# netns file /run/netns/krn-<id>, the packages installed below, and the kernel itself (shared).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CP="$HERE/../controlplane"
LAB="${1:-${KUPORT_REALNODE_DIR:-${TMPDIR:-/tmp}/kuport-realnode}}"
NODE="${KUPORT_REALNODE_NAME:-realnode-1}"
READY_TIMEOUT="${KUPORT_REALNODE_TIMEOUT:-180}"
NODE_IP=10.250.0.2
POD_CIDR=10.244.100.0/24
MARKER=.kuport-realnode
T0=$(date +%s%N)

log() { printf '[realnode] %s\n' "$*" >&2; }
die() { printf '[realnode] ERROR: %s\n' "$*" >&2; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

case "${1:-}" in
  -h|--help) sed -n '2,37p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) die "usage: up.sh [LAB_DIR]" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (namespaces, cgroups, mounts)"

mkdir -p -- "$LAB"
LAB="$(cd -- "$LAB" && pwd -P)"
# The node's mount namespace hides these three: the lab must not live below them.
case "$LAB/" in /run/*|/var/run/*|/var/lib/*|/var/log/*) die "LAB_DIR must not be below /run, /var/lib or /var/log ($LAB)" ;; esac
if [ -f "$LAB/$MARKER" ]; then
  log "$LAB holds a real node already; stopping it first"
  "$HERE/down.sh" "$LAB" >&2
  mkdir -p -- "$LAB"
elif [ -n "$(ls -A "$LAB")" ]; then
  die "$LAB exists, is not empty and is no real-node lab; refusing to touch it"
fi
ID="$(printf '%s' "$LAB" | sha256sum | cut -c1-6)"
NS="krn-$ID"
CG="kuport-realnode-$ID"
echo "$ID" >"$LAB/$MARKER"

# ------------------------------------------------------------------ packages
need=()
for p in containerd runc containernetworking-plugins socat busybox-static gcc libc6-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  log "installing ${need[*]} (Debian)"
  # No init system starts the packaged containerd here (no systemd); the lab starts its own.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; }
fi
CNI_BIN=/usr/lib/cni
for p in bridge host-local loopback; do [ -x "$CNI_BIN/$p" ] || die "no CNI plugin $CNI_BIN/$p"; done

# ------------------------------------------------------------------ binaries, control plane
BIN="$("$CP/build.sh" kube-apiserver kubectl etcd kubelet kube-controller-manager kube-scheduler | tail -n1)"
KUBECTL="$BIN/kubectl"
# ServiceAccount admission on: the controller manager makes the accounts and their CA ConfigMap.
KUPORT_APISERVER_SERVICEACCOUNTS=1 "$CP/up.sh" "$LAB/controlplane" >/dev/null
# shellcheck disable=SC1091
. "$LAB/controlplane/env"
API_PORT="${KUPORT_APISERVER_URL##*:}"
PKI="$LAB/controlplane/pki"
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }

STARTED=0
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] && return
  log "failed (exit $rc); last lines of the logs:"
  for l in containerd kubelet controller-manager scheduler; do
    if [ -f "$LAB/$l.log" ]; then echo "----- $LAB/$l.log" >&2; tail -n 30 "$LAB/$l.log" >&2; fi
  done
  log "state left in $LAB; remove everything with: $HERE/down.sh $LAB"
}
trap on_exit EXIT

# ------------------------------------------------------------------ the node's identity
mkdir -p "$LAB/etc"
(
  cd "$LAB/etc"
  umask 077
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
  openssl ecparam -name prime256v1 -genkey -noout -out kubelet.key 2>/dev/null
  openssl req -new -key kubelet.key -subj "/O=system:nodes/CN=system:node:$NODE" -out kubelet.csr 2>/dev/null
  openssl x509 -req -in kubelet.csr -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -sha256 -days 30 \
    -extfile client.ext -out kubelet.crt 2>/dev/null
  rm -f kubelet.csr client.ext
  cp "$PKI/ca.crt" ca.crt
) || die "openssl: the kubelet's client certificate"
b64() { base64 -w0 <"$1"; }
cat >"$LAB/etc/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(b64 "$LAB/etc/ca.crt")
users:
- name: $NODE
  user:
    client-certificate-data: $(b64 "$LAB/etc/kubelet.crt")
    client-key-data: $(b64 "$LAB/etc/kubelet.key")
contexts:
- name: lab
  context: {cluster: lab, user: $NODE}
current-context: lab
EOF
chmod 600 "$LAB/etc/kubelet.kubeconfig"
# The API server runs RBAC only (no Node authorizer): the nodes' group gets the system:node role.
k apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kuport-realnode-nodes}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:nodes}
EOF

# ------------------------------------------------------------------ images
# shellcheck source=e2e/realnode/image.sh
. "$HERE/image.sh"
build_images "$LAB/images"

# ------------------------------------------------------------------ the node's network namespace
ip netns add "$NS"
echo "$NS" >"$LAB/netns"
ip -n "$NS" link set lo up
# A veth with both ends inside (this kernel has no dummy links); "uplink" can later move to a
# namespace that plays the outside world.
ip -n "$NS" link add eth0 type veth peer name uplink
ip -n "$NS" addr add "$NODE_IP/24" dev eth0
ip -n "$NS" link set uplink up
ip -n "$NS" link set eth0 up
ip -n "$NS" route add default via 10.250.0.1 dev eth0 onlink

# ------------------------------------------------------------------ cgroups (every hierarchy)
CG_DIRS=()
while read -r _ mnt type opts _; do
  case "$type" in cgroup|cgroup2) ;; *) continue ;; esac
  mkdir -p "$mnt/$CG/node"
  CG_DIRS+=("$mnt/$CG")
  if [ "$type" = cgroup ] && [[ ",$opts," == *,cpuset,* ]]; then
    for d in "$mnt/$CG" "$mnt/$CG/node"; do
      cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
      cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
    done
  fi
done </proc/self/mounts
((${#CG_DIRS[@]})) || die "no cgroup hierarchy mounted"
printf '%s\n' "${CG_DIRS[@]}" >"$LAB/cgroups"
# run-in-node CMD...: CMD in the cgroup "node" of every hierarchy, detached, output to a log.
cat >"$LAB/etc/run-in-node" <<EOF
#!/bin/sh
for d in ${CG_DIRS[*]}; do echo \$\$ >"\$d/node/cgroup.procs"; done
exec "\$@"
EOF
chmod +x "$LAB/etc/run-in-node"
start_bg() { # name cmd...
  local name=$1; shift
  nohup setsid "$LAB/etc/run-in-node" "$@" >"$LAB/$name.log" 2>&1 </dev/null &
  echo $! >"$LAB/$name.pid"
}

# ------------------------------------------------------------------ the node's mount namespace
ROOT="$LAB/root"
mkdir -p "$ROOT/run/netns" "$ROOT/run/cni/net.d" "$ROOT/var/lib" "$ROOT/var/log" "$LAB/sysctl"
# The values the kubelet wants (cm.setupKernelTunables), so that it finds them and writes nothing.
declare -A TUNABLES=([vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10
  [kernel/panic_on_oops]=1 [kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000)
binds=""
for t in "${!TUNABLES[@]}"; do
  f="$LAB/sysctl/${t//\//.}"
  echo "${TUNABLES[$t]}" >"$f"
  binds+="mount --bind '$f' /proc/sys/$t"$'\n'
done
cat >"$LAB/etc/mountns.sh" <<EOF
#!/bin/sh
set -e
# Shared as on a systemd host, in a peer group of this namespace only (unshare made every mount
# private first): containerd refuses a HostToContainer volume (the executor's /var/run/netns,
# through the /var/run symlink) whose mount is not shared or slave.
mount --make-shared /
mount --bind '$ROOT/run' /run
mount --bind '$ROOT/var/lib' /var/lib
mount --bind '$ROOT/var/log' /var/log
# Pods' namespaces are pinned here; the executor mounts it with HostToContainer propagation.
mount -t tmpfs -o mode=755 netns /run/netns
mount --make-shared /run/netns
$binds
touch '$LAB/mountns.ready'
exec sleep infinity
EOF
start_bg holder nsenter --net="/run/netns/$NS" unshare --mount --propagation private sh "$LAB/etc/mountns.sh"
for _ in $(seq 1 100); do [ -e "$LAB/mountns.ready" ] && break; sleep 0.05; done
[ -e "$LAB/mountns.ready" ] || { cat "$LAB/holder.log" >&2; die "the node's mount namespace did not come up"; }
HOLDER="$(cat "$LAB/holder.pid")"
# unshare forks nothing here, so the pid is the `sleep` holding both namespaces.
in_node() { nsenter -t "$HOLDER" -m -n -- "$@"; }

# ------------------------------------------------------------------ containerd
cat >"$LAB/etc/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  # No score below containerd's own: lowering one needs CAP_SYS_RESOURCE, which this machine
  # withholds even from root (runc fails "can't get final child's PID" on the sandbox's -998).
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE_IMAGE"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "/run/cni/net.d"
EOF
# ipMasq stays off and there is no portmap (Debian's plugins, 1.1.1, do both with iptables): pods
# talk to the node and to each other, and no pod uses a hostPort.
cat >"$ROOT/run/cni/net.d/10-kuport-realnode.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kuport-realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
T_RT=$(date +%s%N)
start_bg containerd nsenter -t "$HOLDER" -m -n -- containerd --config "$LAB/etc/containerd.toml"
for _ in $(seq 1 100); do in_node ctr version >/dev/null 2>&1 && break; sleep 0.1; done
in_node ctr version >/dev/null 2>&1 || die "containerd did not answer within 10 s"
log "containerd $(in_node ctr version 2>/dev/null | awk '/Server:/ {s=1} s && /Version:/ {print $2; exit}') up in $(ms "$T_RT") ms"
for img in pause testpod; do
  in_node ctr -n k8s.io images import "$LAB/images/$img.tar" >/dev/null
done

# ------------------------------------------------------------------ the API server, inside the node
start_bg relay-host socat "UNIX-LISTEN:$LAB/apiserver.sock,fork,unlink-early,mode=600" "TCP:127.0.0.1:$API_PORT"
start_bg relay-node nsenter --net="/run/netns/$NS" -- socat TCP-LISTEN:6443,fork,reuseaddr "UNIX-CONNECT:$LAB/apiserver.sock"

# Services: the API server's ClusterIP (pods' in-cluster configuration) leads to the relay.
in_node nft -f - <<EOF
table ip krn-services {
  map services {
    type ipv4_addr . inet_service : ipv4_addr . inet_service
    elements = { 10.96.0.1 . 443 : $NODE_IP . 6443 }
  }
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    meta l4proto tcp dnat ip to ip daddr . tcp dport map @services
  }
  chain output {
    type nat hook output priority -100; policy accept;
    meta l4proto tcp dnat ip to ip daddr . tcp dport map @services
  }
}
EOF

# ------------------------------------------------------------------ controller manager, scheduler
# In the node's namespaces and cgroup like the kubelet (their ports stay there), as the lab's
# admin through the relay; no leader election (one of each).
sed "s#server: .*#server: https://127.0.0.1:6443#" "$KUBECONFIG" >"$LAB/etc/admin.kubeconfig"
chmod 600 "$LAB/etc/admin.kubeconfig"
start_bg controller-manager nsenter -t "$HOLDER" -m -n -- "$BIN/kube-controller-manager" \
  --kubeconfig="$LAB/etc/admin.kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
  --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
  --use-service-account-credentials=false --v=1
start_bg scheduler nsenter -t "$HOLDER" -m -n -- "$BIN/kube-scheduler" \
  --kubeconfig="$LAB/etc/admin.kubeconfig" --leader-elect=false --bind-address=127.0.0.1 --v=1

# ------------------------------------------------------------------ kubelet
cat >"$LAB/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 only (docs/decisions.md, "A real kubelet: on the host or in a VM").
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CG
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: 0.0.0.0
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $LAB/etc/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
# The lab's disk is shared and often well used: evict and collect images only when it is full.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%, imagefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 32
# ConfigMap volumes (the chart's CA) follow their ConfigMap at each pod sync: every 5 s, not 60.
syncFrequency: 5s
EOF
T_KL=$(date +%s%N)
start_bg kubelet nsenter -t "$HOLDER" -m -n -- "$BIN/kubelet" \
  --config="$LAB/etc/kubelet.yaml" --kubeconfig="$LAB/etc/kubelet.kubeconfig" \
  --hostname-override="$NODE" --node-ip="$NODE_IP" --v=2

cat >"$LAB/env" <<EOF
# source this file to use the real node's lab
. '$LAB/controlplane/env'
export KUPORT_REALNODE_DIR='$LAB'
export KUPORT_REALNODE_NAME='$NODE'
export KUPORT_REALNODE_IP='$NODE_IP'
export KUPORT_REALNODE_NETNS='$NS'
export KUPORT_REALNODE_HOLDER='$HOLDER'
export KUPORT_REALNODE_CGROUP='$CG'
# node CMD...: CMD in the node's network and mount namespaces.
node() { nsenter -t '$HOLDER' -m -n -- "\$@"; }
# nodectr ARGS...: ctr against the node's containerd, in the CRI's namespace.
nodectr() { nsenter -t '$HOLDER' -m -n -- ctr -n k8s.io "\$@"; }
# krn_service VIP:PORT ADDR:PORT: TCP to VIP:PORT in the node and its pods goes to ADDR:PORT.
krn_service() { node nft add element ip krn-services services "{ \${1%:*} . \${1##*:} : \${2%:*} . \${2##*:} }"; }
EOF

waited=$(date +%s)
said=$waited
until [ "$(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
  pid="$(cat "$LAB/kubelet.pid")"
  [ -d "/proc/$pid" ] || die "the kubelet exited (see $LAB/kubelet.log)"
  (( $(date +%s) - waited < READY_TIMEOUT )) || die "node $NODE not Ready within ${READY_TIMEOUT}s"
  if (( $(date +%s) - said >= 10 )); then
    said=$(date +%s)
    log "node not Ready yet after $((said - waited))s: $(tail -n 1 "$LAB/kubelet.log" | cut -c 1-160)"
  fi
  sleep 0.25
done
log "node $NODE Ready $(ms "$T_KL") ms after the kubelet started ($(ms "$T0") ms after up.sh started)"
# The controller manager allocates no pod CIDRs here: the node gets the bridge CNI's range.
k patch node "$NODE" --type=merge -p "{\"spec\":{\"podCIDR\":\"$POD_CIDR\",\"podCIDRs\":[\"$POD_CIDR\"]}}" >/dev/null
# Pods need their namespace's ServiceAccount and CA ConfigMap (ServiceAccount admission).
for _ in $(seq 1 120); do
  k -n default get serviceaccount default >/dev/null 2>&1 && k -n default get configmap kube-root-ca.crt >/dev/null 2>&1 && break
  for d in controller-manager scheduler; do
    [ -d "/proc/$(cat "$LAB/$d.pid")" ] || die "$d exited (see $LAB/$d.log)"
  done
  sleep 0.25
done
{ k -n default get serviceaccount default && k -n default get configmap kube-root-ca.crt; } >/dev/null 2>&1 \
  || die "no ServiceAccount default/default or ConfigMap kube-root-ca.crt within 30 s (see $LAB/controller-manager.log)"
trap - EXIT
echo "$LAB/env"
