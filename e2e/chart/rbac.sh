#!/usr/bin/env bash
# The chart's controller RBAC against the real controller: enough, and nothing more.
#
# On the lab's control plane (e2e/controlplane, with an audit log of every request the
# controller's ServiceAccount makes), the chart is installed and the controller binary runs out
# of cluster with a token of the chart's ServiceAccount (TokenRequest), so every request it makes
# is authorized by the chart's ClusterRole and Role and nothing else.
#
#  1. Enough: with the example classes, nodes and the web and game examples the controller leads
#     (the Lease), writes the class and PortMap statuses, refuses a conflicting PortMap with a
#     PortConflict event (and patches that event into a series when it repeats), creates its CA
#     and serving certificate (Secret kuport-controller-tls) and publishes the CA (ConfigMap
#     kuport-ca), removes a stale overlay annotation from a Node (--overlay, no member: nodes
#     patch), renews a certificate that is due and brings a stale ConfigMap up to date, reads
#     both back when restarted, watches the ConfigMap kuport-teardown (list and watch of that
#     name), and answers kuportctl for a ServiceAccount bound to the chart's
#     debug ClusterRole (TokenReview, SubjectAccessReview); it logs no "forbidden", and the API
#     server refused none of its requests; every grant was used.
#  2. Minimal: each grant (one resource and verb at a time) is removed from its role, the
#     controller restarted and made to need it; the API server then refuses exactly that
#     request (audit log, 403), the controller's log names it (cannot VERB resource "R" in API
#     group "G"), and where the grant has a visible effect (a status, an event, the Lease) that
#     effect is missing. A grant nothing needs fails the test.
#
# Needs the controller binaries: KUPORT_CONTROLLER_BIN and KUPORT_CTL_BIN, else
# $CARGO_TARGET_DIR/debug/kuport-controller and kuportctl (target/ without CARGO_TARGET_DIR),
# built with `cargo build -p kuport-controller --locked` when missing or older than the sources,
# and openssl (a certificate that is due, made with the Secret's CA; e2e/controlplane/up.sh
# installs it when missing). The Single-mode datapath end to end is the lab's
# (e2e/README.md); here no executor runs, so Programmed stays False (Pending).
#
# Usage: e2e/chart/rbac.sh            Prints "N passed, M failed" last; exits non-zero on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LC_ALL=C

t0=$(date +%s)
chart=charts/kuport
ns=kuport-system
release=kuport
sa=kuport-controller     # the chart's controller ServiceAccount (release "kuport")
lease=kuport-controller  # the Deployment's --lease-name
cr=kuport-controller     # its ClusterRole
role=kuport-controller-leader-election
tls_role=kuport-controller-tls  # the managed certificate's Secret and the CA's ConfigMap
teardown_role=kuport-controller-teardown # the teardown ConfigMap, watched
secret=kuport-controller-tls     # both names fixed in the controller
configmap=kuport-ca
debug_cr=kuport-debug            # kuportctl's users' ClusterRole
debug_sa=rbac-debug              # a ServiceAccount bound to it, made here
user="system:serviceaccount:$ns:$sa"
identity=rbac-test

work=$(mktemp -d "${TMPDIR:-/tmp}/kuport-rbac.XXXXXX")
state="$work/controlplane" # up.sh creates it
audit_log="$work/audit.log"
passed=0
failed=0
failures=()
evidence=()
infos=()
ctl_pid=
run_no=0

log() { printf '[rbac] %s\n' "$*" >&2; }

stop_controller() {
  [ -n "$ctl_pid" ] || return 0
  if kill -0 "$ctl_pid" 2>/dev/null; then
    kill -TERM "$ctl_pid" 2>/dev/null || true
    # It releases the Lease on SIGTERM (at most 2 s), then exits.
    for _ in $(seq 1 50); do kill -0 "$ctl_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$ctl_pid" 2>/dev/null || true
  fi
  wait "$ctl_pid" 2>/dev/null || true
  ctl_pid=
}

finish() {
  local rc=$?
  stop_controller
  if [ -f "$state/.kuport-controlplane" ]; then
    if [ "$failed" != 0 ] || [ "$rc" != 0 ]; then
      for l in kube-apiserver etcd; do
        [ -f "$state/$l.log" ] && { echo "----- $l.log (tail)" >&2; tail -n 20 "$state/$l.log" >&2; }
      done
    fi
    e2e/controlplane/down.sh "$state" >/dev/null 2>&1 || log "down.sh failed for $state"
  fi
  if [ "${KUPORT_KEEP_STATE:-}" = 1 ]; then log "kept $work (KUPORT_KEEP_STATE=1)"; else rm -rf "$work"; fi
  if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
    log "FAILED outside a check (exit $rc)"
    failed=1
  fi
  if ((${#infos[@]})); then
    log "the controller with the chart's RBAC:"
    printf '[rbac]   %s\n' "${infos[@]}" >&2
  fi
  if ((${#evidence[@]})); then
    log "evidence per grant (grant removed: refused by the API server | the controller's log | the missing effect):"
    printf '[rbac]   %s\n' "${evidence[@]}" >&2
  fi
  if ((failed)); then
    log "failed:"
    printf '[rbac]   %s\n' "${failures[@]:-setup}" >&2
  fi
  log "finished in $(($(date +%s) - t0))s"
  echo "$passed passed, $failed failed"
  ((failed == 0)) || exit 1
  exit 0
}
trap finish EXIT

# check NAME FUNCTION ARGS...: runs the function in a subshell with errexit in force, counts it
# and goes on. Lines "INFO: ..." and "EVIDENCE: ..." in its output are kept for the summary.
check() {
  local name=$1 rc s
  shift
  s=$(date +%s.%N)
  set +e
  (
    set -euo pipefail
    "$@"
  ) >"$work/check.log" 2>&1
  rc=$?
  set -e
  s=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  while IFS= read -r l; do evidence+=("$l"); done < <(sed -n 's/^EVIDENCE: //p' "$work/check.log")
  while IFS= read -r l; do infos+=("$l"); done < <(sed -n 's/^INFO: //p' "$work/check.log")
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    log "ok: $name (${s}s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    log "FAIL: $name (${s}s)"
    sed 's/^/    /' "$work/check.log" >&2
  fi
}

# ------------------------------------------------------------------------------- binaries
# shellcheck source=e2e/chart/binaries.sh
. e2e/chart/binaries.sh

if [ -n "${KUPORT_CONTROLLER_BIN:-}" ]; then
  ctl=$KUPORT_CONTROLLER_BIN
  kuportctl=${KUPORT_CTL_BIN:-$(dirname "$ctl")/kuportctl}
else
  ctl=${CARGO_TARGET_DIR:-target}/debug/kuport-controller
  kuportctl=${CARGO_TARGET_DIR:-target}/debug/kuportctl
  # What the binaries are built from (not tests or benches: they would rebuild them for nothing).
  if [ ! -x "$ctl" ] || [ ! -x "$kuportctl" ] || [ -n "$(find Cargo.toml Cargo.lock controller/Cargo.toml controller/src \
    proto/Cargo.toml proto/build.rs proto/src proto/kuport \( -newer "$ctl" -o -newer "$kuportctl" \) -type f -print -quit)" ]; then
    log "building $ctl and $kuportctl (cargo build -p kuport-controller --locked)"
    cargo build -p kuport-controller --locked >&2
  fi
fi
[ -x "$ctl" ] || { log "no controller binary at $ctl"; exit 1; }
[ -x "$kuportctl" ] || { log "no kuportctl binary at $kuportctl"; exit 1; }
log "binaries: $bin, $ctl, $kuportctl ($(($(date +%s) - t0))s)"

# ------------------------------------------------------------ control plane with an audit log
# Every request of the controller's ServiceAccount, with its response code; nothing else.
cat >"$work/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["$user"]
  - level: None
EOF
t1=$(date +%s)
KUPORT_APISERVER_EXTRA_ARGS="--audit-policy-file=$work/audit-policy.yaml --audit-log-path=$audit_log --audit-log-mode=blocking" \
  e2e/controlplane/up.sh "$state" >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$state/env" # KUBECONFIG (admin), PATH
log "API server up in $(($(date +%s) - t1))s"

# The audit log as "CODE VERB GROUP RESOURCE[/SUB] NAME" (GROUP "core" for "", NAME "-" if none),
# one line per request stage, from line FROM on. Requests about the caller itself
# (selfsubjectreviews and the like, e.g. kubectl auth whoami) are left out; the reviews of its
# callers' tokens and access (tokenreviews, subjectaccessreviews) are its own work.
audit() { # [FROM]
  tail -n +"${1:-1}" "$audit_log" 2>/dev/null | awk '
    function field(s, k) {
      if (!match(s, "\"" k "\":\"[^\"]*\"")) return ""
      s = substr(s, RSTART, RLENGTH); sub("^\"" k "\":\"", "", s); sub("\"$", "", s); return s
    }
    {
      if (!match($0, /"objectRef":\{[^}]*\}/)) next
      ref = substr($0, RSTART, RLENGTH)
      if (!match($0, /"responseStatus":\{.*"code":[0-9]+/)) next
      code = substr($0, RSTART, RLENGTH); sub(/.*"code":/, "", code)
      g = field(ref, "apiGroup"); if (g == "") g = "core"
      r = field(ref, "resource"); sr = field(ref, "subresource"); if (sr != "") r = r "/" sr
      if (g ~ /^(authentication|authorization)\.k8s\.io$/ && r ~ /^self/) next
      n = field(ref, "name"); if (n == "") n = "-"
      print code, field($0, "verb"), g, r, n
    }'
}
audit_lines() { wc -l <"$audit_log" 2>/dev/null || echo 0; }

# ----------------------------------------------------------------------------- the install
install() {
  # The overlay on: the controller runs with --overlay, and `patch nodes` is granted only then.
  helm install "$release" "$chart" -n "$ns" --create-namespace --wait=false --set overlay.enabled=true >/dev/null
  kubectl wait --for=condition=Established --timeout=60s crd/portmapclasses.kuport.wlz.li crd/portmaps.kuport.wlz.li crd/intercepts.kuport.wlz.li
  kubectl -n "$ns" get sa "$sa" -o name
  kubectl get clusterrole "$cr" -o name
  kubectl -n "$ns" get role "$role" -o name
  kubectl -n "$ns" get role "$tls_role" -o name
  kubectl -n "$ns" get role "$teardown_role" -o name
  kubectl get clusterrole "$debug_cr" -o name
}
check "helm install the chart into $ns" install

# A kuportctl user: a ServiceAccount bound to the chart's debug ClusterRole, and its token.
debug_user() {
  kubectl -n "$ns" create serviceaccount "$debug_sa"
  kubectl create clusterrolebinding "$debug_sa" --clusterrole="$debug_cr" --serviceaccount="$ns:$debug_sa"
  kubectl -n "$ns" create token "$debug_sa" --duration=2h >"$work/debug.token"
  [ -s "$work/debug.token" ]
}
check "a kuportctl user: ServiceAccount $debug_sa bound to ClusterRole $debug_cr, with a token" debug_user

token_kubeconfig() {
  local server ca token who
  server=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  token=$(kubectl -n "$ns" create token "$sa" --duration=2h)
  [ -n "$server" ] && [ -n "$ca" ] && [ -n "$token" ]
  cat >"$work/controller.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: lab
    cluster: {server: "$server", certificate-authority-data: "$ca"}
users:
  - name: $sa
    user: {token: "$token"}
contexts:
  - name: $sa
    context: {cluster: lab, user: $sa, namespace: $ns}
current-context: $sa
EOF
  who=$(kubectl --kubeconfig "$work/controller.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}')
  [ "$who" = "$user" ] || { echo "the token authenticates as '$who', not $user"; return 1; }
  echo "token kubeconfig authenticates as $who"
}
check "a TokenRequest token of the chart's ServiceAccount, in a kubeconfig" token_kubeconfig

# The controller runs with --overlay. No executor reports a key, so no node is a member, and a
# published overlay annotation left on a Node is the controller's to remove (nodes patch).
overlay_key=kuport.wlz.li/wireguard-public-key
stale_annotation() { kubectl annotate node edge-a --overwrite "$overlay_key=stale" >/dev/null; }
stale_left() { kubectl get node edge-a -o jsonpath="{.metadata.annotations.${overlay_key//./\\.}}"; }
examples() {
  kubectl apply -f examples/cluster/classes.yaml -f examples/cluster/nodes.yaml \
    -f examples/cluster/web.yaml -f examples/cluster/game.yaml -f examples/intercept/web.yaml
  kubectl apply --server-side --subresource=status -f examples/cluster/nodes.yaml
  # The examples' Pods as their kubelets would report them (apply leaves status out): what vouches
  # for each endpoint (docs/portmap/modes.md, "Which endpoints are believed").
  local ns pod ip
  for pod in web/web-0/10.244.18.7 games/game-0/10.244.2.107; do
    IFS=/ read -r ns pod ip <<<"$pod"
    kubectl patch pod -n "$ns" "$pod" --subresource=status --type=merge \
      -p "{\"status\":{\"phase\":\"Running\",\"podIP\":\"$ip\",\"podIPs\":[{\"ip\":\"$ip\"}]}}"
  done
  stale_annotation
}
check "the example classes, nodes (with status), web and game applied (as admin)" examples

# A copy of game.yaml's PortMap under another name (and a new age): the same ports, so it
# conflicts with game and loses.
conflict_yaml() {
  awk 'BEGIN { doc = "\n" }
    /^---$/ { if (doc ~ /\nkind: PortMap\n/) printf "%s", doc; doc = "\n"; next }
    { doc = doc $0 "\n" }
    END { if (doc ~ /\nkind: PortMap\n/) printf "%s", doc }' examples/cluster/game.yaml \
    | sed -e '/^  creationTimestamp:/d' -e '0,/^  name: game$/s//  name: game-copy/'
}
conflict_yaml | grep -q '^  name: game-copy$' \
  || { log "no PortMap named game in examples/cluster/game.yaml: update conflict_yaml"; exit 1; }

# ------------------------------------------------------------------------------ helpers
# A free port of 127.0.0.1 for the controller's gRPC (kuportctl calls it; no executors connect).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
  || echo $((20000 + RANDOM % 20000)))
# Starts the controller as the ServiceAccount; its log (stderr) goes to $work/run-N.log. The TLS
# Secret's watch reports its errors at debug: shown, so a refused list or watch is in the log.
start_controller() {
  run_no=$((run_no + 1))
  ctl_log="$work/run-$run_no.log"
  NO_COLOR=1 KUBECONFIG="$work/controller.kubeconfig" "$ctl" run --listen "127.0.0.1:$port" --metrics-listen "" \
    --lease-namespace "$ns" --lease-name "$lease" --identity "$identity" --overlay \
    --log-format text --log-level "info,kuport_controller::trust::tls=debug" >/dev/null 2>"$ctl_log" &
  ctl_pid=$!
}
ctl_text() { sed 's/\x1b\[[0-9;]*m//g' "$ctl_log"; }

# within SECONDS CMD...: retries CMD every 0.2 s until it succeeds; fails with its last output.
within() {
  local limit=$1 end out
  shift
  end=$(($(date +%s%N) + limit * 1000000000))
  while :; do
    if out=$("$@" 2>&1); then
      [ -z "$out" ] || echo "$out"
      return 0
    fi
    if (($(date +%s%N) > end)); then
      echo "not within ${limit}s: $*"
      echo "$out"
      return 1
    fi
    sleep 0.2
  done
}

holder() { kubectl -n "$ns" get lease "$lease" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
holds_lease() { local h; h=$(holder); [[ "$h" == "$identity@"* ]] || { echo "holder: '$h'"; return 1; }; }
cond() { # KIND NS NAME TYPE: "status reason"
  kubectl get "$1" ${2:+-n "$2"} "$3" -o go-template="{{range .status.conditions}}{{if eq .type \"$4\"}}{{.status}} {{.reason}}{{end}}{{end}}"
}
is_cond() { # KIND NS NAME TYPE WANT
  local got
  got=$(cond "$1" "$2" "$3" "$4")
  [ "$got" = "$5" ] || { echo "$1 $2/$3 $4: '$got', want '$5'"; return 1; }
}
# events.k8s.io events about a PortMap with a reason: "name count" per line (count = series.count).
events_of() { # NAME REASON
  kubectl -n games get events.v1.events.k8s.io -o go-template="{{range .items}}{{if and (eq .regarding.name \"$1\") (eq .reason \"$2\")}}{{.metadata.name}} {{if .series}}{{.series.count}}{{else}}1{{end}}{{\"\\n\"}}{{end}}{{end}}"
}
has_event() { # NAME REASON [MIN_COUNT]
  local e
  e=$(events_of "$1" "$2")
  [ -n "$e" ] || { echo "no $2 event about $1"; return 1; }
  awk -v m="${3:-1}" '$2 >= m { ok = 1 } END { exit !ok }' <<<"$e" || { echo "$2 events about $1: $e (want count >= ${3:-1})"; return 1; }
}
clear_status() { # KIND NS NAME: as admin, so the controller has to write it again
  kubectl patch "$1" ${2:+-n "$2"} "$3" --subresource=status --type=merge -p '{"status":null}' >/dev/null
}
secret_key() { # KEY: one key of the TLS Secret, decoded
  kubectl -n "$ns" get secret "$secret" -o jsonpath="{.data.${1//./\\.}}" | openssl base64 -d -A
}
serving_days() { # days the Secret's serving certificate has left
  local end
  end=$(secret_key tls.crt | openssl x509 -noout -enddate | cut -d= -f2)
  echo $((($(date -d "$end" +%s) - $(date +%s)) / 86400))
}
# The Secret's serving certificate replaced by a 10-day one (a new key, the same CA): due for renewal.
make_due() {
  local d="$work/due"
  mkdir -p "$d"
  secret_key ca.crt >"$d/ca.crt"
  secret_key ca.key >"$d/ca.key"
  printf 'subjectAltName=DNS:controller.kuport.internal\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=controller.kuport.internal \
    -keyout "$d/tls.key" -out "$d/tls.csr" 2>/dev/null
  openssl x509 -req -days 10 -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -extfile "$d/ext.cnf" -out "$d/tls.crt" 2>/dev/null
  # (A running controller renews it at once: its days left are not checked here.)
  kubectl -n "$ns" patch secret "$secret" --type=merge -p "{\"data\":{\"tls.crt\":\"$(openssl base64 -A -in "$d/tls.crt")\",\"tls.key\":\"$(openssl base64 -A -in "$d/tls.key")\"}}" >/dev/null
}
make_stale() { # the ConfigMap's CA bundle replaced by something else (made so if missing)
  if kubectl -n "$ns" get configmap "$configmap" >/dev/null 2>&1; then
    kubectl -n "$ns" patch configmap "$configmap" --type=merge -p '{"data":{"ca.crt":"stale"}}' >/dev/null
  else
    kubectl -n "$ns" create configmap "$configmap" --from-literal=ca.crt=stale >/dev/null
  fi
}
ca_published() { # the ConfigMap holds the Secret's CA
  [ "$(kubectl -n "$ns" get configmap "$configmap" -o jsonpath='{.data.ca\.crt}')" = "$(secret_key ca.crt)" ] \
    || { echo "ConfigMap $configmap does not hold the Secret's ca.crt"; return 1; }
}
# kuportctl nodes as the debug user, verifying the controller with the ConfigMap's CA.
debug_call() {
  kubectl -n "$ns" get configmap "$configmap" -o jsonpath='{.data.ca\.crt}' >"$work/ca.crt" 2>/dev/null || true
  "$kuportctl" --controller "https://127.0.0.1:$port" --ca-file "$work/ca.crt" --token "$(cat "$work/debug.token")" nodes 2>&1
}
served_serial() { # the serial of the certificate a new TLS handshake gets
  openssl s_client -connect "127.0.0.1:$port" -servername controller.kuport.internal -alpn h2 </dev/null 2>/dev/null \
    | openssl x509 -noout -serial
}
fresh_conflict() { # a new game-copy, without status or events
  kubectl -n games delete pm game-copy --ignore-not-found --wait=true >/dev/null
  kubectl -n games delete events.v1.events.k8s.io --all >/dev/null
  conflict_yaml | kubectl apply -f - >/dev/null
}

# ------------------------------------------------------------------------- 1. it is enough
ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { awk -v d=$(($(ms) - $1)) 'BEGIN { printf "%.1f s", d / 1000 }'; }

main_from=$(( $(audit_lines) + 1 ))
start_controller
log "controller started (pid $ctl_pid, log $ctl_log)"
t_start=$(ms)

leads() {
  within 30 holds_lease >/dev/null
  echo "INFO: Lease $ns/$lease held by $(holder) ($(secs_since "$t_start") after start)"
}
check "it holds the Lease (holder $identity@...) within 30 s" leads

classes_written() {
  local c
  has() { # CLASS
    local links conds
    conds=$(kubectl get pmc "$1" -o go-template='{{with .status}}{{range .conditions}}{{.type}}={{.status}}/{{.reason}} {{end}}{{end}}')
    [ -n "$conds" ] || { echo "pmc $1: no status.conditions"; return 1; }
    links=$(kubectl get pmc "$1" -o go-template='{{with .status}}{{with .links}}{{range .}}{{.}}; {{end}}{{end}}{{end}}')
    echo "pmc $1: conditions $conds links: ${links:-none}"
  }
  for c in public intranet; do
    echo "INFO: $(within 30 has "$c") ($(secs_since "$t_start") after start)"
  done
  # public joins edge-a (it accepts game's ports) to worker-2 (game's pod): a link in its status.
  [ "$(kubectl get pmc public -o go-template='{{len .status.links}}')" -ge 1 ] || { echo "pmc public: no links"; return 1; }
}
check "the classes' status (links, conditions) is written" classes_written

stale_gone() { [ -z "$(stale_left)" ]; }
stale_removed() {
  within 30 stale_gone >/dev/null || { echo "Node edge-a keeps $overlay_key=$(stale_left)"; return 1; }
  echo "Node edge-a is no overlay member: the stale $overlay_key was removed"
}
check "with --overlay, a non-member Node's stale published annotation is removed (nodes patch)" stale_removed

port_maps_accepted() {
  local pm
  for pm in web/web games/game; do
    within 30 is_cond pm "${pm%/*}" "${pm#*/}" Accepted "True Accepted"
    # No executor runs here, so nothing is programmed.
    within 30 is_cond pm "${pm%/*}" "${pm#*/}" Programmed "False Pending"
    echo "INFO: pm $pm: Accepted=$(cond pm "${pm%/*}" "${pm#*/}" Accepted), Programmed=$(cond pm "${pm%/*}" "${pm#*/}" Programmed) ($(secs_since "$t_start") after start)"
  done
}
check "the PortMaps are Accepted=True (Programmed False/Pending: no executors)" port_maps_accepted

conflict_event() {
  local t
  t=$(ms)
  conflict_yaml | kubectl apply -f -
  within 30 is_cond pm games game-copy Accepted "False PortConflict"
  within 30 has_event game-copy PortConflict
  echo "INFO: pm games/game-copy (game's ports): Accepted=$(cond pm games game-copy Accepted), event $(events_of game-copy PortConflict) ($(secs_since "$t") after apply)"
}
check "a conflicting PortMap is refused (PortConflict) with an event" conflict_event

event_series() {
  local t
  t=$(ms)
  # The same refusal again in the same process: the recorder patches its event into a series.
  clear_status pm games game-copy
  within 30 has_event game-copy PortConflict 2
  echo "INFO: the refusal again (status cleared): event $(events_of game-copy PortConflict) with series.count 2 ($(secs_since "$t"))"
}
check "the same refusal again patches the event (series.count 2)" event_series

managed_tls() {
  within 30 ca_published >/dev/null
  local want got
  want=$(secret_key tls.crt | openssl x509 -noout -serial)
  got=$(within 10 served_serial)
  [ "$got" = "$want" ] || { echo "served $got, the Secret holds $want"; return 1; }
  echo "INFO: Secret $secret (CA and serving certificate, $(serving_days) days left) created, CA published in ConfigMap $configmap, $got served"
}
check "it creates Secret $secret, publishes its CA in ConfigMap $configmap and serves the certificate" managed_tls

debug_answered() {
  local out
  out=$(within 20 debug_call) || { echo "$out"; return 1; }
  grep -q "^NODE " <<<"$out" || { echo "$out"; return 1; }
  echo "INFO: kuportctl nodes as $debug_sa (bound to $debug_cr): answered, $(grep -c . <<<"$out") lines"
}
check "kuportctl as a user bound to $debug_cr is answered (TokenReview, SubjectAccessReview)" debug_answered

# With only a kubeconfig (its token), kuportctl finds the leader in the Lease and the CA in the
# ConfigMap: the chart's debug Role, bound in the release namespace, lets it read those two.
debug_kubeconfig() {
  sed -e "s|token: \"[^\"]*\"|token: \"$(cat "$work/debug.token")\"|" -e "s|$sa|$debug_sa|g" \
    "$work/controller.kubeconfig" >"$work/debug.kubeconfig"
}
plain_call() { KUBECONFIG="$work/debug.kubeconfig" "$kuportctl" -n "$ns" nodes 2>&1; }
debug_plain() {
  local out
  debug_kubeconfig
  ! out=$(plain_call) || { echo "answered without the Role: $out"; return 1; }
  grep -q "forbidden" <<<"$out" || { echo "not refused for RBAC: $out"; return 1; }
  echo "INFO: without the Role: $(tail -n1 <<<"$out" | cut -c1-140)"
  kubectl -n "$ns" create rolebinding "$debug_sa" --role="$debug_cr" --serviceaccount="$ns:$debug_sa" >/dev/null
  out=$(within 10 plain_call) || { echo "$out"; return 1; }
  grep -q "^NODE " <<<"$out" || { echo "$out"; return 1; }
  local as="system:serviceaccount:$ns:$debug_sa"
  [ "$(kubectl -n "$ns" auth can-i get configmaps/other --as="$as")" = no ] || { echo "reads other ConfigMaps"; return 1; }
  [ "$(kubectl -n "$ns" auth can-i get "secrets/$secret" --as="$as")" = no ] || { echo "reads the serving Secret"; return 1; }
  echo "INFO: with Role $debug_cr bound: answered; other ConfigMaps and Secret $secret stay unreadable"
}
check "kuportctl with only a kubeconfig: refused without Role $debug_cr, answered with it (Lease and CA only)" debug_plain

renewed() { local d; d=$(serving_days); [ "$d" -gt 60 ] || { echo "$d days left"; return 1; }; }
renewal() {
  local t
  make_stale
  make_due
  t=$(ms)
  within 30 renewed >/dev/null || { echo "the 10-day certificate was not renewed: $(serving_days) days left"; return 1; }
  ctl_text | grep -q "renewed the serving certificate" || { echo "no renewal in the log"; return 1; }
  within 30 ca_published >/dev/null
  echo "INFO: a 10-day certificate and a stale ConfigMap: renewed ($(serving_days) days left) and the CA published again ($(secs_since "$t"))"
}
check "a serving certificate that is due is renewed, a stale ConfigMap brought up to date" renewal

# Restarted here, not in a check: a check runs in a subshell, and the controller's pid must be
# known to stop it.
ca_before=$(secret_key ca.crt | openssl x509 -noout -fingerprint -sha256)
first_log=$ctl_log
stop_controller
start_controller
restarted() {
  local ca=$ca_before
  within 30 holds_lease >/dev/null
  within 20 debug_call >/dev/null
  [ "$(secret_key ca.crt | openssl x509 -noout -fingerprint -sha256)" = "$ca" ] || { echo "a new CA"; return 1; }
  ca_published
  echo "INFO: restarted: it read Secret $secret and ConfigMap $configmap back (same CA) and serves again"
}
check "restarted, it reads the Secret and the ConfigMap back (same CA)" restarted

clean() {
  local bad other
  bad=$( (sed 's/\x1b\[[0-9;]*m//g' "$first_log"; ctl_text) | grep -i forbidden || true)
  [ -z "$bad" ] || { echo "the controller log has 'forbidden':"; echo "$bad"; return 1; }
  bad=$(audit "$main_from" | awk '$1 == 401 || $1 == 403' | sort | uniq -c)
  [ -z "$bad" ] || { echo "the API server refused:"; echo "$bad"; return 1; }
  echo "INFO: $(audit "$main_from" | wc -l) audited requests, none refused (401/403); no 'forbidden' in its log"
  # Other errors are not about RBAC (the first Lease get is a 404); shown, not failed.
  other=$(audit "$main_from" | awk '$1 >= 400' | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)
  [ -z "$other" ] || echo "INFO: other error responses (not RBAC): $other"
}
check "no 'forbidden' in the controller log; the API server refused none of its requests" clean

# Every grant of a role as "GROUP RESOURCE VERB NAME" lines (NAME "-" without resourceNames).
grants() { # clusterrole NAME | role NAME
  local args=("$1" "$2")
  [ "$1" = role ] && args+=(-n "$ns")
  kubectl get "${args[@]}" -o go-template='{{range .rules}}{{$r := .}}{{range .apiGroups}}{{$g := .}}{{range $r.resources}}{{$res := .}}{{range $r.verbs}}{{$v := .}}{{if $r.resourceNames}}{{range $r.resourceNames}}{{if $g}}{{$g}}{{else}}core{{end}} {{$res}} {{$v}} {{.}}{{"\n"}}{{end}}{{else}}{{if $g}}{{$g}}{{else}}core{{end}} {{$res}} {{$v}} -{{"\n"}}{{end}}{{end}}{{end}}{{end}}{{end}}' | sort
}

every_grant_used() {
  local used want g r v n c missing= line lbl
  # What it did with success (2xx), as "GROUP RESOURCE VERB NAME".
  used=$(audit "$main_from" | awk '$1 < 300 { print $3, $4, $2, $5 }' | sort)
  want=$( (grants clusterrole "$cr"; grants role "$role"; grants role "$tls_role"; grants role "$teardown_role") | sort -u)
  line=
  while read -r g r v n; do
    if [ "$n" = - ]; then
      c=$(grep -c "^$g $r $v " <<<"$used" || true)
    else
      c=$(grep -c "^$g $r $v $n\$" <<<"$used" || true)
    fi
    lbl="$v $g/$r"
    [ "$n" = - ] || lbl+=" ($n)"
    [ "$c" -gt 0 ] || missing+="$lbl"$'\n'
    line+="${line:+, }$lbl x$c"
  done <<<"$want"
  echo "INFO: grants used (successful requests): $line"
  [ -z "$missing" ] || { echo "granted but never used in this run:"; printf '%s' "$missing"; return 1; }
  # And nothing it did successfully lies outside the grants (e.g. through another binding).
  while read -r g r v n; do
    grep -q "^$g $r $v " <<<"$want" || { echo "a request outside the chart's grants succeeded: $v $g/$r $n"; return 1; }
  done <<<"$(sort -u <<<"$used")"
}
check "every grant of the ClusterRole and Role was used, and nothing else (audit log)" every_grant_used
stop_controller
log "released: holder now '$(holder)'"

# --------------------------------------------------------------------- 2. it is minimal
# For each grant: the role without it, the controller restarted and made to need it.
rules_json() { # lines "GROUP RESOURCE VERB NAME" -> a JSON rules array, one rule per line
  local g r v n out=
  while read -r g r v n; do
    [ -n "$g" ] || continue
    [ "$g" = core ] && g=
    out+="${out:+,}{\"apiGroups\":[\"$g\"],\"resources\":[\"$r\"],\"verbs\":[\"$v\"]"
    [ "$n" = - ] || out+=",\"resourceNames\":[\"$n\"]"
    out+="}"
  done
  echo "[$out]"
}
set_rules() { # KIND NAME JSON
  local args=("$1" "$2")
  [ "$1" = role ] && args+=(-n "$ns")
  kubectl patch "${args[@]}" --type=merge -p "{\"rules\":$3}" >/dev/null
}
# What kubectl auth can-i says for the ServiceAccount about one grant.
can_i() { # GROUP RESOURCE VERB NAME
  local what=$2 sub=() args=()
  if [[ "$2" == */* ]]; then what=${2%%/*}; sub=(--subresource="${2#*/}"); fi
  [ "$1" = core ] || what="$what.$1"
  [ "$4" = - ] || what="$what/$4"
  case $2 in leases | secrets | configmaps) args=(-n "$ns") ;; *) args=(-A) ;; esac
  kubectl auth can-i "$3" "$what" "${sub[@]}" "${args[@]}" --as="$user" 2>/dev/null || true
}
can_i_is() { local got; got=$(can_i "$1" "$2" "$3" "$4"); [ "$got" = "$5" ] || { echo "can-i $3 $2: $got"; return 1; }; }

cr_rules=$(kubectl get clusterrole "$cr" -o jsonpath='{.rules}')
role_rules=$(kubectl -n "$ns" get role "$role" -o jsonpath='{.rules}')
tls_role_rules=$(kubectl -n "$ns" get role "$tls_role" -o jsonpath='{.rules}')
teardown_role_rules=$(kubectl -n "$ns" get role "$teardown_role" -o jsonpath='{.rules}')

# Sets up what makes the controller need the grant (before it starts).
prepare() { # GROUP RESOURCE VERB
  case "$2 $3" in
    "portmapclasses/status patch") clear_status pmc "" public ;;
    "portmaps/status patch") clear_status pm web web ;;
    "intercepts/status patch") clear_status intercept web web ;;
    "events create" | "events patch") fresh_conflict ;;
    "leases create") kubectl -n "$ns" delete lease "$lease" --ignore-not-found >/dev/null ;;
    "secrets create") kubectl -n "$ns" delete secret "$secret" --ignore-not-found >/dev/null ;;
    "configmaps create") kubectl -n "$ns" delete configmap "$configmap" --ignore-not-found >/dev/null ;;
    "secrets update") make_due ;;
    "configmaps update") make_stale ;;
    "nodes patch") stale_annotation ;;
  esac
}
# What makes the running controller need the grant, repeated until the API server refuses it.
need() { # GROUP RESOURCE VERB
  case "$2 $3" in
    "tokenreviews create" | "subjectaccessreviews create") debug_call >/dev/null || true ;;
  esac
}
# What the controller must log when the grant is missing (an ERE): the API server's message,
# quoted as is or, in kube-runtime's Debug output, with escaped quotes.
log_pattern() { # GROUP RESOURCE VERB
  local g=$1 q='\\?"'
  [ "$g" = core ] && g=
  echo "cannot $3 resource $q$(re_escape "$2")$q in API group $q$(re_escape "$g")$q"
}
re_escape() { sed 's/[].[*^$()+?{|\\]/\\&/g' <<<"$1"; }
# The effect that must be missing, checked after the refusal was seen; prints what it saw.
effect_missing() { # GROUP RESOURCE VERB
  case "$2 $3" in
    "portmapclasses/status patch")
      [ -z "$(kubectl get pmc public -o go-template='{{with .status}}{{.}}{{end}}')" ] && echo "pmc public has no status" ;;
    "portmaps/status patch")
      [ -z "$(kubectl -n web get pm web -o go-template='{{with .status}}{{.}}{{end}}')" ] && echo "pm web/web has no status" ;;
    "intercepts/status patch")
      [ -z "$(kubectl -n web get intercept web -o go-template='{{with .status}}{{.}}{{end}}')" ] && echo "intercept web/web has no status" ;;
    "events create")
      [ -z "$(events_of game-copy PortConflict)" ] && echo "game-copy is refused ($(cond pm games game-copy Accepted)) but has no event" ;;
    "events patch")
      [ "$(events_of game-copy PortConflict | awk '{ print $2 }')" = 1 ] && echo "refused again, its event stays at count 1" ;;
    "leases create")
      ! kubectl -n "$ns" get lease "$lease" >/dev/null 2>&1 && ! kill -0 "$ctl_pid" 2>/dev/null \
        && echo "no Lease; the controller exited" ;;
    "leases get")
      ! kill -0 "$ctl_pid" 2>/dev/null && echo "the controller exited" ;;
    "leases patch")
      [[ "$(holder)" != "$identity@"* ]] && echo "holder '$(holder)': it never leads" ;;
    "tokenreviews create" | "subjectaccessreviews create")
      local out
      ! out=$(debug_call) && echo "kuportctl refused: $(tail -n1 <<<"$out" | cut -c1-160)" ;;
    "secrets create")
      ! kubectl -n "$ns" get secret "$secret" >/dev/null 2>&1 && echo "no Secret $secret" ;;
    "secrets get")
      ! kill -0 "$ctl_pid" 2>/dev/null && echo "the controller exited" ;;
    "secrets update")
      [ "$(serving_days)" -le 10 ] && echo "the due certificate is not renewed ($(serving_days) days left)" ;;
    "configmaps create")
      ! kubectl -n "$ns" get configmap "$configmap" >/dev/null 2>&1 && echo "no ConfigMap $configmap" ;;
    "configmaps update")
      ! ca_published >/dev/null && echo "ConfigMap $configmap stays stale" ;;
    "nodes patch")
      [ "$(stale_left)" = stale ] && echo "Node edge-a keeps $overlay_key=stale" ;;
    *) echo "" ;;
  esac
}
refused() { # FROM GROUP RESOURCE VERB NAME: the API server refused it (403), once at least
  audit "$1" | awk -v g="$2" -v r="$3" -v v="$4" -v n="$5" \
    '$1 == 403 && $3 == g && $4 == r && $2 == v && (n == "-" || $5 == n) { c++ } END { if (!c) exit 1; print c }'
}
logged() { # ERE: the first line of the log that matches, kuport's own before kube-runtime's
  local m k
  m=$(ctl_text | grep -E -- "$1") || return 1 # grep reads it all: no SIGPIPE under pipefail
  k=$(grep -E 'kuport_controller|^error:' <<<"$m" || true)
  m=${k:-$m}
  printf '%s\n' "${m%%$'\n'*}"
}

minimal() { # KIND NAME FULL_RULES GROUP RESOURCE VERB NAME
  local kind=$1 obj=$2 full=$3 g=$4 r=$5 v=$6 n=$7 from pat line count effect t ran
  local all rest
  # However this ends (it runs in check's subshell): the controller stopped, the role restored.
  # shellcheck disable=SC2064 # expanded now: the locals are gone when the trap runs
  trap "stop_controller; set_rules $(printf '%q ' "$kind" "$obj" "$full") || echo 'could not restore $kind $obj'" EXIT
  fail() {
    echo "$*"
    [ -z "${ctl_log:-}" ] || { echo "controller log (tail):"; ctl_text | tail -n 20; }
    return 1
  }
  all=$(grants "$kind" "$obj")
  rest=$(grep -vxF "$g $r $v $n" <<<"$all")
  [ "$rest" != "$all" ] || fail "no grant '$g $r $v $n' in $kind $obj"
  set_rules "$kind" "$obj" "$(rules_json <<<"$rest")"
  # The authorizer sees it at once; wait until it does.
  within 10 can_i_is "$g" "$r" "$v" "$n" no >/dev/null || fail "can-i still says yes"
  prepare "$g" "$r" "$v"
  from=$(( $(audit_lines) + 1 ))
  t=$(ms)
  start_controller
  if [ "$v $r" = "patch events" ]; then
    # The first refusal is published (create); the same one again is a series (patch).
    within 20 has_event game-copy PortConflict >/dev/null || fail "no first PortConflict event"
    clear_status pm games game-copy
  fi
  needed() { need "$g" "$r" "$v"; refused "$from" "$g" "$r" "$v" "$n"; }
  within 20 needed >/dev/null \
    || fail "the API server refused no '$v $g/$r' within 20 s: nothing needed this grant"
  pat=$(log_pattern "$g" "$r" "$v")
  line=$(within 20 logged "$pat") || fail "no log line matching: $pat"
  # "<where>: <message> ... cannot VERB resource "R" in API group "G""
  line="$(sed -E 's/^[^ ]+ +(WARN|ERROR|INFO|DEBUG) +//; s/: Kube error: .*//; s/: ApiError: .*//; s/ (error with 403|error 403): .*/ \1/; s/ error[=:] ?.*//' <<<"$line") ... $(grep -oE "$pat" <<<"$line" | head -n1 | sed 's/\\"/"/g')"
  effect=$(effect_missing "$g" "$r" "$v" || true)
  sleep 1
  count=$(refused "$from" "$g" "$r" "$v" "$n")
  ran=$(secs_since "$t")
  stop_controller
  set_rules "$kind" "$obj" "$full"
  within 10 can_i_is "$g" "$r" "$v" "$n" yes >/dev/null
  local what="$v $g/$r"
  [ "$n" = - ] || what+=" (name $n)"
  echo "EVIDENCE: $what: 403 x$count in $ran | log: $line${effect:+ | $effect}"
}

while read -r g r v n; do
  [ -n "$g" ] || continue
  check "minimal: without ClusterRole '$v $g/$r' the API server refuses it" minimal clusterrole "$cr" "$cr_rules" "$g" "$r" "$v" "$n"
done <<<"$(grants clusterrole "$cr")"
# Each grant of one Role, removed in turn.
minimal_role() { # ROLE FULL_RULES
  local g r v n label
  while read -r g r v n; do
    [ -n "$g" ] || continue
    label="$v $g/$r"
    [ "$n" = - ] || label+=" ($n)"
    check "minimal: without Role $1 '$label' the API server refuses it" minimal role "$1" "$2" "$g" "$r" "$v" "$n"
  done <<<"$(grants role "$1")"
}
minimal_role "$role" "$role_rules"
minimal_role "$tls_role" "$tls_role_rules"
minimal_role "$teardown_role" "$teardown_role_rules"

restored() {
  [ "$(kubectl get clusterrole "$cr" -o jsonpath='{.rules}')" = "$cr_rules" ]
  [ "$(kubectl -n "$ns" get role "$role" -o jsonpath='{.rules}')" = "$role_rules" ]
  [ "$(kubectl -n "$ns" get role "$tls_role" -o jsonpath='{.rules}')" = "$tls_role_rules" ]
  [ "$(kubectl -n "$ns" get role "$teardown_role" -o jsonpath='{.rules}')" = "$teardown_role_rules" ]
}
check "the roles are back as the chart made them" restored
