#!/usr/bin/env bash
# Start a local Kubernetes control plane (etcd + kube-apiserver) with no
# Docker, no images, no kubelet and no controllers.
#
# Usage: up.sh [STATE_DIR]
#   STATE_DIR defaults to $KUPORT_STATE_DIR or ${TMPDIR:-/tmp}/kuport-controlplane.
#
# What it does:
#   * builds/reuses kube-apiserver, kubectl, etcd via build.sh (cached);
#   * picks free loopback ports for etcd (client + peer) and the apiserver;
#   * generates with openssl: a CA, an apiserver serving cert (127.0.0.1,
#     localhost, kubernetes.default.svc..., 10.96.0.1), an admin client cert
#     (CN=kuport-admin, O=system:masters) and a service-account signing key;
#   * starts etcd (data in STATE_DIR/etcd) and kube-apiserver (https on
#     127.0.0.1, RBAC, SA token signing, service CIDR 10.96.0.0/16, the
#     ServiceAccount admission plugin disabled since no token/SA controller
#     runs; KUPORT_APISERVER_SERVICEACCOUNTS=1 keeps it on, for a lab whose
#     kube-controller-manager makes the accounts: e2e/realnode) detached with
#     setsid/nohup, logging to STATE_DIR/*.log, pids in STATE_DIR/*.pid;
#   * writes STATE_DIR/kubeconfig (self-contained, embedded certs) and
#     STATE_DIR/env (shell-sourceable: KUBECONFIG, KUPORT_BIN, ports, ...);
#   * waits until /readyz is ok (KUPORT_READY_TIMEOUT seconds, default 180).
#
# Running it again on a STATE_DIR whose processes are alive and ready is a no-op.
# Optional environment: KUPORT_APISERVER_PORT, KUPORT_ETCD_PORT,
# KUPORT_ETCD_PEER_PORT (fixed ports instead of free random ones),
# KUPORT_APISERVER_EXTRA_ARGS (appended, word-split), KUPORT_CACHE (see build.sh).
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "usage: $(basename "$0") [STATE_DIR]   (see --help)" >&2; exit 2 ;;
esac

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${1:-${KUPORT_STATE_DIR:-${TMPDIR:-/tmp}/kuport-controlplane}}"
READY_TIMEOUT="${KUPORT_READY_TIMEOUT:-180}"
MARKER=".kuport-controlplane"

log() { printf '[up] %s\n' "$*" >&2; }
die() { printf '[up] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- prerequisites
if ! command -v openssl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "openssl not found; installing it from Debian (apt-get install openssl)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2
  fi
  command -v openssl >/dev/null 2>&1 || die "openssl is required (apt-get install openssl)"
fi

BIN="$("$HERE/build.sh" kube-apiserver kubectl etcd | tail -n1)"
KUBECTL="$BIN/kubectl"

mkdir -p -- "$STATE"
STATE="$(cd -- "$STATE" && pwd)"
KCFG="$STATE/kubeconfig"

pid_alive() { # pidfile expected-binary-name
  local f="$STATE/$1.pid" p
  [ -f "$f" ] || return 1
  p="$(cat "$f")"
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- "$2" || return 1
}

# --------------------------------------------------------- already running?
if [ -f "$STATE/$MARKER" ]; then
  if pid_alive etcd "$BIN/etcd" && pid_alive kube-apiserver "$BIN/kube-apiserver" \
     && "$KUBECTL" --kubeconfig "$KCFG" get --raw /readyz >/dev/null 2>&1; then
    log "control plane in $STATE is already up and ready"
    echo "$KCFG"
    exit 0
  fi
  log "stale control plane state in $STATE; stopping leftovers and starting fresh"
  "$HERE/down.sh" "$STATE" >&2
  mkdir -p -- "$STATE"
elif [ -n "$(ls -A "$STATE")" ]; then
  die "$STATE exists, is not empty and is not a kuport control-plane state dir; refusing to touch it"
fi
touch "$STATE/$MARKER"

STARTED_PIDS=()
cleanup_on_error() {
  local rc=$?
  [ "$rc" = 0 ] && return
  log "startup failed (exit $rc); last lines of the logs:"
  for l in etcd kube-apiserver; do
    [ -f "$STATE/$l.log" ] && { echo "----- $STATE/$l.log" >&2; tail -n 25 "$STATE/$l.log" >&2; }
  done
  for p in "${STARTED_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  log "state left in $STATE for inspection (remove with: $HERE/down.sh $STATE)"
}
trap cleanup_on_error EXIT

# ------------------------------------------------------------------- ports
# Random free ports below the kernel's ephemeral range (so that outgoing
# connections cannot grab them between the check and the bind). If a port is
# taken anyway (parallel runs), the start below retries with fresh ports.
EPHEMERAL_LO="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
[ "$EPHEMERAL_LO" -gt 12000 ] 2>/dev/null || EPHEMERAL_LO=32768
port_in_use() {
  local hex; hex="$(printf ':%04X' "$1")"
  # any socket bound to that local port, IPv4 or IPv6, listening or not
  awk 'NR>1 {print $2}' /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q -- "${hex}\$" && return 0
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
  return 1
}
TAKEN=" "
free_port() { # prints a port and records it in TAKEN (call without $(...))
  local p
  for _ in $(seq 1 500); do
    p=$(( 10000 + (RANDOM * 32768 + RANDOM) % (EPHEMERAL_LO - 10000) ))
    case "$TAKEN" in *" $p "*) continue ;; esac
    port_in_use "$p" && continue
    TAKEN="$TAKEN$p "
    FREE_PORT="$p"; return 0
  done
  die "could not find a free TCP port on 127.0.0.1"
}
pick_etcd_ports() {
  if [ -n "${KUPORT_ETCD_PORT:-}" ]; then ETCD_PORT="$KUPORT_ETCD_PORT"; else free_port; ETCD_PORT="$FREE_PORT"; fi
  if [ -n "${KUPORT_ETCD_PEER_PORT:-}" ]; then ETCD_PEER_PORT="$KUPORT_ETCD_PEER_PORT"; else free_port; ETCD_PEER_PORT="$FREE_PORT"; fi
  ETCD_URL="http://127.0.0.1:$ETCD_PORT"
}
pick_api_port() {
  if [ -n "${KUPORT_APISERVER_PORT:-}" ]; then API_PORT="$KUPORT_APISERVER_PORT"; else free_port; API_PORT="$FREE_PORT"; fi
  API_URL="https://127.0.0.1:$API_PORT"
}

# ------------------------------------------------------------------- pki
PKI="$STATE/pki"
mkdir -p "$PKI"
log "generating CA, serving cert, admin client cert and service-account key in $PKI"
(
  cd "$PKI"
  umask 077
  ossl() { openssl "$@" 2>/dev/null; }
  # CA
  ossl ecparam -name prime256v1 -genkey -noout -out ca.key
  ossl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=kuport-lab-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.crt
  # apiserver serving cert
  cat >apiserver.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:::1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
  ossl ecparam -name prime256v1 -genkey -noout -out apiserver.key
  ossl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr
  ossl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
    -extfile apiserver.ext -out apiserver.crt
  # admin client cert: user kuport-admin, group system:masters
  cat >client.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
  ossl ecparam -name prime256v1 -genkey -noout -out admin.key
  ossl req -new -key admin.key -subj "/O=system:masters/CN=kuport-admin" -out admin.csr
  ossl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
    -extfile client.ext -out admin.crt
  # service-account token signing key pair
  ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
  ossl pkey -in sa.key -pubout -out sa.pub
  rm -f ./*.csr ./*.ext
) || die "openssl certificate generation failed"

# ------------------------------------------------------------------- kubeconfig
b64() { base64 -w0 <"$1"; }
write_kubeconfig() {
  (umask 077; cat >"$KCFG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kuport-lab
  cluster:
    server: $API_URL
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: kuport-admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: kuport-lab
  context:
    cluster: kuport-lab
    user: kuport-admin
current-context: kuport-lab
EOF
  )
}

# ------------------------------------------------------------------- start
start_bg() { # name cmd...
  local name="$1"; shift
  nohup setsid "$@" >"$STATE/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$STATE/$name.pid"
  STARTED_PIDS+=("$pid")
}
port_clash() { grep -q 'address already in use' "$STATE/$1.log" 2>/dev/null; }

T0=$(date +%s%N)
for attempt in 1 2 3; do
  pick_etcd_ports
  rm -rf "$STATE/etcd"
  log "starting etcd on $ETCD_URL (peer port $ETCD_PEER_PORT), data in $STATE/etcd"
  start_bg etcd "$BIN/etcd" \
    --name=kuport \
    --data-dir="$STATE/etcd" \
    --listen-client-urls="$ETCD_URL" \
    --advertise-client-urls="$ETCD_URL" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="kuport=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --unsafe-no-fsync=true \
    --log-level=warn
  ok=0
  for _ in $(seq 1 120); do
    if curl -fsS --max-time 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'; then ok=1; break; fi
    pid_alive etcd "$BIN/etcd" || break
    sleep 0.5
  done
  [ "$ok" = 1 ] && break
  if ! pid_alive etcd "$BIN/etcd" && port_clash etcd && [ "$attempt" -lt 3 ] \
     && [ -z "${KUPORT_ETCD_PORT:-}${KUPORT_ETCD_PEER_PORT:-}" ]; then
    log "etcd could not bind its ports (taken meanwhile); retrying with other ports"
    continue
  fi
  pid_alive etcd "$BIN/etcd" && die "etcd did not become healthy within 60s (see $STATE/etcd.log)"
  die "etcd exited during startup (see $STATE/etcd.log)"
done
log "etcd healthy after $(( ($(date +%s%N) - T0) / 1000000 ))ms"

T1=$(date +%s%N)
for attempt in 1 2 3; do
  pick_api_port
  write_kubeconfig
  log "starting kube-apiserver on $API_URL"
  admission=(--disable-admission-plugins=ServiceAccount)
  [ "${KUPORT_APISERVER_SERVICEACCOUNTS:-0}" = 1 ] && admission=()
  # shellcheck disable=SC2086
  start_bg kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="$ETCD_URL" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$API_PORT" \
    --cert-dir="$PKI" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=RBAC \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/16 \
    "${admission[@]}" \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --profiling=false \
    ${KUPORT_APISERVER_EXTRA_ARGS:-}
  ok=0
  waiting=$(date +%s)
  said=$waiting
  for _ in $(seq 1 $(( READY_TIMEOUT * 2 ))); do
    if "$KUBECTL" --kubeconfig "$KCFG" --request-timeout=3s get --raw /readyz >/dev/null 2>&1; then ok=1; break; fi
    pid_alive kube-apiserver "$BIN/kube-apiserver" || break
    # Usually ready in 3-7 s (e2e/README.md); a slow start says so every 10 s.
    if (( $(date +%s) - said >= 10 )); then
      said=$(date +%s)
      log "kube-apiserver not ready yet after $((said - waiting))s (usually 3-7 s, limit ${READY_TIMEOUT}s): $(tail -n 1 "$STATE/kube-apiserver.log" | cut -c 1-120)"
    fi
    sleep 0.5
  done
  [ "$ok" = 1 ] && break
  if ! pid_alive kube-apiserver "$BIN/kube-apiserver" && port_clash kube-apiserver && [ "$attempt" -lt 3 ] \
     && [ -z "${KUPORT_APISERVER_PORT:-}" ]; then
    log "kube-apiserver could not bind port $API_PORT (taken meanwhile); retrying with another port"
    continue
  fi
  pid_alive kube-apiserver "$BIN/kube-apiserver" \
    && die "kube-apiserver not ready within ${READY_TIMEOUT}s (see $STATE/kube-apiserver.log)"
  die "kube-apiserver exited during startup (see $STATE/kube-apiserver.log)"
done
T2=$(date +%s%N)

cat >"$STATE/env" <<EOF
# source this file to talk to the kuport lab control plane
export KUBECONFIG='$KCFG'
export KUPORT_STATE_DIR='$STATE'
export KUPORT_BIN='$BIN'
export KUPORT_APISERVER_URL='$API_URL'
export KUPORT_ETCD_URL='$ETCD_URL'
export PATH='$BIN':"\$PATH"
EOF
trap - EXIT
log "kube-apiserver ready after $(( (T2 - T1) / 1000000 ))ms (total start incl. etcd: $(( (T2 - T0) / 1000000 ))ms)"
log "kubeconfig: $KCFG    (source $STATE/env to get KUBECONFIG and PATH)"
echo "$KCFG"
