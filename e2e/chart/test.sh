#!/usr/bin/env bash
# Tests of the Helm chart charts/kuport, without the running controller (no kubelet: pods never
# start). Offline: helm lint, golden renders, the CRD copy, RBAC and security contexts of the
# render, the monitoring objects and their alert rules (promtool). Online, against the lab's
# real kube-apiserver (e2e/controlplane): install, every object there, the RBAC as the API
# server evaluates it, the CRDs accept the examples, upgrade, uninstall keeps only the CRDs.
# That those grants are enough for the real controller, and each one needed, is
# e2e/chart/rbac.sh's (it needs the controller binary, so it runs after cargo).
#
# Usage: e2e/chart/test.sh            (UPDATE_GOLDEN=1 rewrites e2e/chart/golden/*.yaml)
# Prints "N passed, M failed" last and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LC_ALL=C

t0=$(date +%s)
chart=charts/kuport
here=e2e/chart
ns=kuport-system
release=kuport

work=$(mktemp -d "${TMPDIR:-/tmp}/kuport-chart.XXXXXX")
state="$work/controlplane" # up.sh creates it
passed=0
failed=0
failures=()

log() { printf '[chart] %s\n' "$*" >&2; }

finish() {
  local rc=$?
  if [ -f "$state/.kuport-controlplane" ]; then
    if [ "$failed" != 0 ] || [ "$rc" != 0 ]; then
      for l in kube-apiserver etcd; do
        [ -f "$state/$l.log" ] && { echo "----- $l.log (tail)" >&2; tail -n 20 "$state/$l.log" >&2; }
      done
    fi
    e2e/controlplane/down.sh "$state" >/dev/null 2>&1 || log "down.sh failed for $state"
  fi
  rm -rf "$work"
  if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
    log "FAILED outside a check (exit $rc)"
    failed=1
  fi
  if ((failed)); then
    log "failed:"
    printf '[chart]   %s\n' "${failures[@]:-setup}" >&2
  fi
  log "finished in $(($(date +%s) - t0))s"
  echo "$passed passed, $failed failed"
  ((failed == 0)) || exit 1
  exit 0
}
trap finish EXIT

# check NAME FUNCTION ARGS...: runs the function in a subshell with errexit in force (so every
# failing command inside fails the check), counts it and goes on with the next check.
check() {
  local name=$1 rc
  shift
  set +e
  (
    set -euo pipefail
    "$@"
  ) >"$work/check.log" 2>&1
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    log "ok: $name"
  else
    failed=$((failed + 1))
    failures+=("$name")
    log "FAIL: $name"
    sed 's/^/    /' "$work/check.log" >&2
  fi
}

# ------------------------------------------------------------------------------- binaries
# shellcheck source=e2e/chart/binaries.sh
. e2e/chart/binaries.sh
log "binaries in $bin ($(($(date +%s) - t0))s)"
# shellcheck source=e2e/chart/promtool.sh
. e2e/chart/promtool.sh
# The offline checks must not reach any cluster.
export KUBECONFIG=/dev/null

# Offline, helm assumes Kubernetes 1.20; the chart needs 1.32 (Chart.yaml kubeVersion).
kube_version=1.32.0

render() { # VARIANT: helm template of the chart with the variant's values
  local args=()
  [ "$1" = custom ] && args=(-f "$here/custom-values.yaml")
  [ "$1" = intercept ] && args=(--set interception.enabled=true)
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" "${args[@]}"
}

# kubectl's go-template over every object of a rendered file, with no cluster (--local).
objects() { # FILE TEMPLATE
  kubectl label --local -f "$1" kuport-chart-test- -o go-template="$2" 2>"$work/label.err" \
    || { cat "$work/label.err"; return 1; }
}

# One line per granted (kind/name, apiGroup, resource, verb[, name=N for each resourceName]);
# "core" for the "" group.
rbac_rules() { # FILE
  objects "$1" '{{if or (eq .kind "ClusterRole") (eq .kind "Role")}}{{$o := printf "%s/%s" .kind .metadata.name}}{{range .rules}}{{$r := .}}{{range .apiGroups}}{{$g := .}}{{range $r.resources}}{{$res := .}}{{range $r.verbs}}{{$v := .}}{{if $r.resourceNames}}{{range $r.resourceNames}}{{$o}} {{if $g}}{{$g}}{{else}}core{{end}} {{$res}} {{$v}} name={{.}}{{"\n"}}{{end}}{{else}}{{$o}} {{if $g}}{{$g}}{{else}}core{{end}} {{$res}} {{$v}}{{"\n"}}{{end}}{{end}}{{end}}{{end}}{{if $r.nonResourceURLs}}{{$o}} has nonResourceURLs{{"\n"}}{{end}}{{end}}{{end}}' | sort
}

bindings() { # FILE: "Kind/name -> RoleKind/role Subject:ns/name ..."
  objects "$1" '{{if or (eq .kind "ClusterRoleBinding") (eq .kind "RoleBinding")}}{{.kind}}/{{.metadata.name}} -> {{.roleRef.kind}}/{{.roleRef.name}}{{range .subjects}} {{.kind}}:{{.namespace}}/{{.name}}{{end}}{{"\n"}}{{end}}' | sort
}

expect_eq() { # WHAT GOT WANT
  if [ "$2" != "$3" ]; then
    echo "$1:"
    diff -u <(printf '%s\n' "$3") <(printf '%s\n' "$2") | sed '1s/.*/--- want/;2s/.*/+++ got/' || true
    return 1
  fi
}

# The controller's grants: exactly what the code uses (templates/controller-rbac.yaml says
# why; e2e/chart/rbac.sh runs the controller and shows each one is needed).
want_cluster_rules() { # CLUSTERROLE [overlay]
  local cr=$1 r v
  {
    for r in nodes namespaces services pods; do for v in list watch; do echo "ClusterRole/$cr core $r $v"; done; done
    # Nodes are written (their overlay annotations) only with the overlay on.
    [ "${2:-}" = overlay ] && echo "ClusterRole/$cr core nodes patch"
    for v in list watch; do echo "ClusterRole/$cr discovery.k8s.io endpointslices $v"; done
    for r in portmapclasses portmaps intercepts; do
      for v in list watch; do echo "ClusterRole/$cr kuport.wlz.li $r $v"; done
      echo "ClusterRole/$cr kuport.wlz.li $r/status patch"
    done
    for v in create patch; do echo "ClusterRole/$cr events.k8s.io events $v"; done
    echo "ClusterRole/$cr authentication.k8s.io tokenreviews create"
    echo "ClusterRole/$cr authorization.k8s.io subjectaccessreviews create"
  } | sort
}

want_role_rules() { # ROLE LEASE
  local v
  {
    echo "Role/$1 coordination.k8s.io leases create"
    for v in get patch list watch; do echo "Role/$1 coordination.k8s.io leases $v name=$2"; done
  } | sort
}

# The managed serving certificate's Secret and the CA's ConfigMap (names fixed in the controller);
# only without controller.tls.secretName.
want_tls_rules() { # ROLE
  local v
  {
    echo "Role/$1 core secrets create"
    echo "Role/$1 core configmaps create"
    for v in get update list watch; do echo "Role/$1 core secrets $v name=kuport-controller-tls"; done
    for v in get update; do echo "Role/$1 core configmaps $v name=kuport-ca"; done
  } | sort
}

# Uninstall's teardown (templates/teardown.yaml): the controller watches its ConfigMap; the
# pre-delete hook's account sets it, finds the leader and lists the nodes (the debug ClusterRole).
want_teardown_rules() { # PREFIX
  local c="$1-controller" v
  {
    for v in list watch; do echo "Role/$c-teardown core configmaps $v name=kuport-teardown"; done
    echo "Role/$1-teardown core configmaps patch name=kuport-teardown"
    echo "Role/$1-teardown coordination.k8s.io leases get name=$c"
  } | sort
}

# kuportctl's users' ClusterRole: what the Debug service asks SubjectAccessReviews for; their
# Role: the leader's Lease and the CA's ConfigMap, which kuportctl reads to find and verify it.
want_debug_rules() { # NAME LEASE CONFIGMAP
  printf '%s\n' "ClusterRole/$1 kuport.wlz.li nodestates get" "ClusterRole/$1 kuport.wlz.li nodestates list" \
    "ClusterRole/$1 kuport.wlz.li portmaps get" "Role/$1 coordination.k8s.io leases get name=$2" \
    "Role/$1 core configmaps get name=$3" | sort
}

# ------------------------------------------------------------------------ offline checks
lint() { # [VALUES]
  local args=(--kube-version "$kube_version")
  [ -n "${1:-}" ] && args+=(-f "$1")
  helm lint --strict "$chart" "${args[@]}" "${@:2}"
}
check "helm lint (default values)" lint
check "helm lint (custom values)" lint "$here/custom-values.yaml"
check "helm lint (interception enabled)" lint "" --set interception.enabled=true
check "helm lint (overlay enabled)" lint "" --set overlay.enabled=true

render default >"$work/default.yaml"
render custom >"$work/custom.yaml"
render intercept >"$work/intercept.yaml"

golden() { # VARIANT
  local want="$here/golden/$1.yaml" got="$work/$1.yaml"
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    mkdir -p "$here/golden"
    cp "$got" "$want"
    echo "rewrote $want"
    return 0
  fi
  [ -f "$want" ] || { echo "$want is missing; run UPDATE_GOLDEN=1 $0"; return 1; }
  diff -u "$want" "$got" || { echo "render differs from $want; if intended: UPDATE_GOLDEN=1 $0"; return 1; }
}
check "helm template matches golden/default.yaml" golden default
check "helm template matches golden/custom.yaml" golden custom
check "helm template matches golden/intercept.yaml" golden intercept

# What interception adds to the executor (values.yaml, interception), and only when enabled:
# the host PID namespace, SYS_ADMIN and SYS_PTRACE, /var/run/netns and the CRI socket.
executor_view() { # FILE: hostPID, capabilities added, --cri-socket's value, volumes
  objects "$1" '{{if eq .kind "DaemonSet"}}{{with .spec.template.spec}}hostPID={{.hostPID}} {{range .containers}}caps={{.securityContext.capabilities.add}} cri={{$next := false}}{{range .args}}{{if $next}}{{.}}{{end}}{{$next = eq . "--cri-socket"}}{{end}} mounts={{range .volumeMounts}}{{.name}}:{{.mountPath}}{{with .mountPropagation}}({{.}}){{end}},{{end}}{{end}} volumes={{range .volumes}}{{.name}}{{with .hostPath}}:{{.path}}({{.type}}){{end}},{{end}}{{end}}{{end}}'
}
interception() {
  expect_eq "interception off (default)" "$(executor_view "$work/default.yaml")" \
    "hostPID=<no value> caps=[NET_ADMIN] cri= mounts=state:/var/lib/kuport,token:/var/run/secrets/kuport,ca:/etc/kuport/ca, volumes=state:/var/lib/kuport(DirectoryOrCreate),token,ca,"
  expect_eq "interception on" "$(executor_view "$work/intercept.yaml")" \
    "hostPID=true caps=[NET_ADMIN SYS_ADMIN SYS_PTRACE] cri=/run/containerd/containerd.sock mounts=state:/var/lib/kuport,token:/var/run/secrets/kuport,ca:/etc/kuport/ca,netns:/var/run/netns(HostToContainer),cri:/run/containerd/containerd.sock, volumes=state:/var/lib/kuport(DirectoryOrCreate),token,ca,netns:/var/run/netns(DirectoryOrCreate),cri:/run/containerd/containerd.sock(Socket),"
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" --set interception.enabled=true \
    --set interception.criSocket=/var/run/crio/crio.sock >"$work/crio.yaml"
  grep -q "cri=/var/run/crio/crio.sock .*cri:/var/run/crio/crio.sock(Socket)" <<<"$(executor_view "$work/crio.yaml")" \
    || { executor_view "$work/crio.yaml"; return 1; }
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" --set interception.enabled=true \
    --set interception.criSocket= >"$work/nocri.yaml"
  expect_eq "interception without a CRI socket" "$(executor_view "$work/nocri.yaml")" \
    "hostPID=true caps=[NET_ADMIN SYS_ADMIN SYS_PTRACE] cri=none mounts=state:/var/lib/kuport,token:/var/run/secrets/kuport,ca:/etc/kuport/ca,netns:/var/run/netns(HostToContainer), volumes=state:/var/lib/kuport(DirectoryOrCreate),token,ca,netns:/var/run/netns(DirectoryOrCreate),"
  expect_eq "a privileged executor gets no capability list (custom)" \
    "$(helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" -f "$here/custom-values.yaml" --set interception.enabled=true | grep -c 'SYS_ADMIN' || true)" 0
  if helm template "$release" "$chart" --kube-version "$kube_version" --set interception.criSocket=relative.sock >/dev/null 2>&1; then
    echo "a relative interception.criSocket was accepted"
    return 1
  fi
}
check "interception adds hostPID, SYS_ADMIN, SYS_PTRACE, /var/run/netns and the CRI socket, only when enabled" interception

crds_fresh() {
  diff -u crds/kuport.wlz.li.yaml "$chart/crds/kuport.wlz.li.yaml" \
    || { echo "stale: cp crds/kuport.wlz.li.yaml $chart/crds/"; return 1; }
}
check "chart crds/ equals crds/kuport.wlz.li.yaml" crds_fresh

schema_rejects() {
  if helm template "$release" "$chart" --kube-version "$kube_version" --set controller.replica=3 >/dev/null 2>"$work/schema.err"; then
    echo "a misspelt value (controller.replica) was accepted"
    return 1
  fi
  grep -q "additional properties 'replica' not allowed" "$work/schema.err" || { cat "$work/schema.err"; return 1; }
  if helm template "$release" "$chart" --kube-version "$kube_version" --set log.level=verbose >/dev/null 2>"$work/schema.err"; then
    echo "log.level=verbose was accepted"
    return 1
  fi
  grep -q "/log/level" "$work/schema.err" || { cat "$work/schema.err"; return 1; }
}
check "values.schema.json rejects unknown keys and bad values" schema_rejects

# The overlay (values.yaml, overlay): the controller's three flags when enabled, none otherwise,
# and the executor unchanged (the kernel backend needs only NET_ADMIN); a device name the executor
# would not own is refused.
controller_args() { # FILE
  objects "$1" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{range .args}}{{.}} {{end}}{{end}}{{end}}'
}
overlay() {
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" --set overlay.enabled=true \
    --set overlay.listenPort=51900 >"$work/overlay.yaml"
  grep -q -- "--overlay --overlay-interface kup-wg --overlay-port 51900 " <<<"$(controller_args "$work/overlay.yaml")" \
    || { controller_args "$work/overlay.yaml"; return 1; }
  if grep -q -- "--overlay" <<<"$(controller_args "$work/default.yaml")"; then
    echo "the overlay is on by default"
    return 1
  fi
  expect_eq "the overlay leaves the executor as it is" "$(executor_view "$work/overlay.yaml")" "$(executor_view "$work/default.yaml")"
  if helm template "$release" "$chart" --kube-version "$kube_version" --set overlay.interface=kuport-wg >/dev/null 2>&1; then
    echo "overlay.interface=kuport-wg (not under kup-) was accepted"
    return 1
  fi
}
check "overlay.enabled passes --overlay, --overlay-interface and --overlay-port to the controller only" overlay

no_wildcards() { # FILE
  local rules bad
  rules=$(rbac_rules "$1")
  [ -n "$rules" ] || { echo "no RBAC rules found in $1"; return 1; }
  bad=$(grep -E ' \*( |$)|\* |name=\*|nonResourceURLs' <<<"$rules" || true)
  [ -z "$bad" ] || { echo "wildcards or non-resource rules:"; echo "$bad"; return 1; }
}
check "RBAC: no * in any verb, resource or apiGroup (default)" no_wildcards "$work/default.yaml"
check "RBAC: no * in any verb, resource or apiGroup (custom)" no_wildcards "$work/custom.yaml"

exact_rbac() { # FILE PREFIX MANAGED_TLS CA_CONFIGMAP
  local file=$1 c="$2-controller"
  local got
  got=$(rbac_rules "$file")
  expect_eq "grants" "$got" "$( (want_cluster_rules "$c"; want_role_rules "$c-leader-election" "$c"
    want_debug_rules "$2-debug" "$c" "$4"; want_teardown_rules "$2"; [ "$3" = managed ] && want_tls_rules "$c-tls") | sort)"
  # The Roles are namespaced to the release namespace.
  [ "$(objects "$file" '{{if eq .kind "Role"}}{{.metadata.namespace}}{{"\n"}}{{end}}' | sort -u)" = "$ns" ]
}
check "RBAC: controller, debug ClusterRoles and the leases, TLS Roles grant exactly the list (default)" exact_rbac "$work/default.yaml" kuport managed kuport-ca
check "RBAC: the same without the TLS Role: the operator's Secret is mounted (custom)" exact_rbac "$work/custom.yaml" portmapper mounted kuport-serving-ca

# Per feature: `patch nodes` only with overlay.enabled (the rest of the list unchanged).
overlay_rbac() {
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" --set overlay.enabled=true >"$work/overlay-rbac.yaml"
  expect_eq "overlay grants" "$(rbac_rules "$work/overlay-rbac.yaml" | grep '^ClusterRole/kuport-controller ')" \
    "$(want_cluster_rules kuport-controller overlay)"
}
check "RBAC: nodes patch only with overlay.enabled" overlay_rbac

# The lab grants its Debug caller the chart's debug rules (e2e/src/plane/access.yaml).
lab_debug_rules() {
  expect_eq "the lab's kuport-debug rules" "$(rbac_rules e2e/src/plane/access.yaml | grep -E '^(Cluster)?Role/kuport-debug ')" \
    "$(rbac_rules "$work/default.yaml" | grep -E '^(Cluster)?Role/kuport-debug ')"
}
check "RBAC: the lab's debug ClusterRole and Role have the chart's rules" lab_debug_rules

exec_unbound() { # FILE PREFIX MANAGED_TLS
  local file=$1 p=$2 got
  got=$(bindings "$file")
  expect_eq "bindings" "$got" "$( {
    printf '%s\n' \
      "ClusterRoleBinding/$p-controller -> ClusterRole/$p-controller ServiceAccount:$ns/$p-controller" \
      "RoleBinding/$p-controller-leader-election -> Role/$p-controller-leader-election ServiceAccount:$ns/$p-controller" \
      "RoleBinding/$p-controller-teardown -> Role/$p-controller-teardown ServiceAccount:$ns/$p-controller" \
      "RoleBinding/$p-teardown -> Role/$p-teardown ServiceAccount:$ns/$p-teardown" \
      "ClusterRoleBinding/$p-teardown -> ClusterRole/$p-debug ServiceAccount:$ns/$p-teardown"
    [ "$3" = managed ] && echo "RoleBinding/$p-controller-tls -> Role/$p-controller-tls ServiceAccount:$ns/$p-controller"
  } | sort)"
  if grep -q "$p-node-exec" <<<"$got"; then echo "the executor is bound"; return 1; fi
  # No API token either: on its ServiceAccount and on its pods.
  expect_eq "executor SA automount" \
    "$(objects "$file" '{{if and (eq .kind "ServiceAccount") (eq .metadata.name "'"$p"'-node-exec")}}{{.automountServiceAccountToken}}{{end}}')" false
  expect_eq "executor pod automount" \
    "$(objects "$file" '{{if eq .kind "DaemonSet"}}{{.spec.template.spec.automountServiceAccountToken}}{{end}}')" false
}
check "RBAC: the executor has no binding and no API token (default)" exec_unbound "$work/default.yaml" kuport managed
check "RBAC: the executor has no binding and no API token (custom)" exec_unbound "$work/custom.yaml" portmapper mounted

# The executor's identity: one projected token for the controller's audience, bound to its pod,
# refreshed by the kubelet; the CA mounted without subPath (updates reach the pod); both passed.
executor_trust() { # FILE PREFIX CA_SOURCE
  local file=$1 p=$2
  expect_eq "executor volumes" "$(objects "$file" '{{if eq .kind "DaemonSet"}}{{range .spec.template.spec.volumes}}{{.name}}:{{if .projected}}{{range .projected.sources}}{{with .serviceAccountToken}}token({{.audience}},{{.expirationSeconds}},{{.path}}){{end}}{{end}}{{end}}{{with .configMap}}configMap({{.name}},{{.optional}}){{end}}{{with .secret}}secret({{.secretName}},{{range .items}}{{.key}}{{end}},{{.optional}}){{end}}{{with .hostPath}}hostPath{{end}} {{end}}{{end}}')" \
    "state:hostPath token:token(kuport.wlz.li/node-exec,3600,token) ca:$3 "
  expect_eq "executor mounts" "$(objects "$file" '{{if eq .kind "DaemonSet"}}{{range .spec.template.spec.containers}}{{range .volumeMounts}}{{.name}}:{{.mountPath}}:{{.subPath}} {{end}}{{end}}{{end}}' | sed 's/<no value>//g')" \
    "state:$4: token:/var/run/secrets/kuport: ca:/etc/kuport/ca: "
  local args
  args=$(objects "$file" '{{if eq .kind "DaemonSet"}}{{range .spec.template.spec.containers}}{{range .args}}{{.}} {{end}}{{end}}{{end}}')
  grep -q -- "--controller https://" <<<"$args" || { echo "executor args: $args"; return 1; }
  grep -q -- "--token-file /var/run/secrets/kuport/token --ca-file /etc/kuport/ca/ca.crt" <<<"$args" || { echo "executor args: $args"; return 1; }
  args=$(objects "$file" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{range .args}}{{.}} {{end}}{{end}}{{end}}')
  grep -q -- "--executor-audience kuport.wlz.li/node-exec --executor-service-account \$(POD_NAMESPACE):$p-node-exec" <<<"$args" \
    || { echo "controller args: $args"; return 1; }
}
check "the executor's token (audience, 1 h) and CA volumes, no subPath (default)" executor_trust "$work/default.yaml" kuport "configMap(kuport-ca,true)" /var/lib/kuport
check "the executor's CA from the operator's ConfigMap, never the serving Secret (custom)" executor_trust "$work/custom.yaml" portmapper "configMap(kuport-serving-ca,true)" /var/lib/portmapper

# The serving Secret holds the key: no executor mounts it, and with secretName the CA's
# ConfigMap must be named.
ca_only() {
  local f
  for f in "$work/default.yaml" "$work/custom.yaml" "$work/intercept.yaml"; do
    if objects "$f" '{{if eq .kind "DaemonSet"}}{{range .spec.template.spec.volumes}}{{if .secret}}{{.secret.secretName}}{{end}}{{end}}{{end}}' | grep -q .; then
      echo "$f: the executor mounts a Secret"; return 1
    fi
  done
  if helm template "$release" "$chart" --kube-version "$kube_version" --set controller.tls.secretName=s >/dev/null 2>"$work/ca.err"; then
    echo "controller.tls.secretName without caConfigMap was accepted"; return 1
  fi
  grep -q "controller.tls.caConfigMap" "$work/ca.err" || { cat "$work/ca.err"; return 1; }
}
check "executors mount only the CA, never the serving Secret" ca_only

mounted_tls() {
  local f="$work/custom.yaml"
  expect_eq "controller tls" "$(objects "$f" '{{if eq .kind "Deployment"}}{{with .spec.template.spec}}{{range .volumes}}{{.name}}:{{.secret.secretName}} {{end}}{{range .containers}}{{range .volumeMounts}}{{.name}}:{{.mountPath}}:{{.readOnly}} {{end}}{{end}}{{end}}{{end}}')" \
    "tls:kuport-serving tls:/etc/kuport/tls:true "
  objects "$f" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{range .args}}{{.}} {{end}}{{end}}{{end}}' | grep -q -- "--tls-dir /etc/kuport/tls"
  # Default: no --tls-dir (the controller manages its CA).
  if objects "$work/default.yaml" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{range .args}}{{.}} {{end}}{{end}}{{end}}' | grep -q -- "--tls-dir"; then
    echo "--tls-dir in the default render"; return 1
  fi
}
check "controller.tls.secretName mounts the Secret and passes --tls-dir (custom only)" mounted_tls

security() {
  local f="$work/default.yaml"
  expect_eq "controller security" "$(objects "$f" '{{if eq .kind "Deployment"}}{{with .spec.template.spec}}{{.securityContext.runAsNonRoot}} {{range .containers}}{{.securityContext.readOnlyRootFilesystem}} {{.securityContext.allowPrivilegeEscalation}} {{.securityContext.capabilities.drop}} {{.securityContext.capabilities.add}}{{end}}{{end}}{{end}}')" \
    "true true false [ALL] <no value>"
  expect_eq "executor security" "$(objects "$f" '{{if eq .kind "DaemonSet"}}{{with .spec.template.spec}}{{.hostNetwork}} {{.dnsPolicy}} {{.priorityClassName}} {{.tolerations}} {{range .containers}}{{.securityContext.runAsUser}} {{.securityContext.privileged}} {{.securityContext.readOnlyRootFilesystem}} {{.securityContext.capabilities.drop}} {{.securityContext.capabilities.add}}{{end}}{{end}}{{end}}')" \
    "true ClusterFirstWithHostNet system-node-critical [map[operator:Exists]] 0 false true [ALL] [NET_ADMIN]"
  expect_eq "executor update strategy" "$(objects "$f" '{{if eq .kind "DaemonSet"}}{{.spec.updateStrategy.type}} {{.spec.updateStrategy.rollingUpdate.maxUnavailable}} {{.spec.template.spec.terminationGracePeriodSeconds}}{{end}}')" \
    "RollingUpdate 1 5"
  # The custom values' privileged executor must not also carry allowPrivilegeEscalation=false
  # (the API rejects that pair); the server-side dry run below proves it is accepted.
  expect_eq "privileged executor" "$(objects "$work/custom.yaml" '{{if eq .kind "DaemonSet"}}{{range .spec.template.spec.containers}}{{.securityContext.privileged}} {{.securityContext.allowPrivilegeEscalation}}{{end}}{{end}}')" \
    "true <no value>"
}
check "security contexts (controller non-root, read-only, no caps; executor NET_ADMIN only)" security

# Monitoring (values.yaml, monitoring): a ServiceMonitor, a PrometheusRule and the Grafana
# dashboard's ConfigMap, each only when enabled. That every series they use is one the controller
# exports is controller/tests/metrics.rs's (it needs the controller's registry).
monitoring_sets=(--set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true
  --set monitoring.dashboard.enabled=true)
check "helm lint (monitoring enabled)" lint "" "${monitoring_sets[@]}"
helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" "${monitoring_sets[@]}" \
  --show-only templates/monitoring-servicemonitor.yaml --show-only templates/monitoring-prometheusrule.yaml \
  --show-only templates/monitoring-dashboard.yaml >"$work/monitoring.yaml"
check "helm template matches golden/monitoring.yaml (the three monitoring objects)" golden monitoring

kinds() { # FILE: kind/name of every object
  objects "$1" '{{.kind}}/{{.metadata.name}}{{"\n"}}' | sort
}
monitoring_objects() {
  local all
  if kinds "$work/default.yaml" | grep -E '^(ServiceMonitor/|PrometheusRule/|ConfigMap/kuport-dashboard$)'; then
    echo "monitoring objects in the default render"; return 1
  fi
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" "${monitoring_sets[@]}" >"$work/monitoring-all.yaml"
  all=$(kinds "$work/monitoring-all.yaml")
  expect_eq "monitoring objects" "$(grep -E '^(ServiceMonitor/|PrometheusRule/|ConfigMap/kuport-dashboard$)' <<<"$all")" \
    "$(printf '%s\n' ConfigMap/kuport-dashboard PrometheusRule/kuport-controller ServiceMonitor/kuport-controller)"
  # Nothing else changes.
  expect_eq "the rest of the render" "$(grep -vE '^(ServiceMonitor/|PrometheusRule/|ConfigMap/kuport-dashboard$)' <<<"$all")" "$(kinds "$work/default.yaml")"
  # The ServiceMonitor scrapes the port the Service names metrics, which the controller serves
  # /metrics on (--metrics-listen).
  expect_eq "scrape" "$(objects "$work/monitoring.yaml" '{{if eq .kind "ServiceMonitor"}}{{range .spec.endpoints}}{{.port}} {{.path}}{{end}} {{.spec.selector.matchLabels}}{{end}}')" \
    "metrics /metrics map[app.kubernetes.io/component:controller app.kubernetes.io/instance:kuport app.kubernetes.io/name:kuport]"
  grep -q -- "--metrics-listen 0.0.0.0:9090 " <<<"$(controller_args "$work/default.yaml")"
  # The sidecar's label is configurable (null drops the default one: Helm merges maps).
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" --set monitoring.dashboard.enabled=true \
    --set monitoring.dashboard.labels.grafana_dashboard=null --set monitoring.dashboard.labels.dashboards=kuport \
    --set monitoring.dashboard.namespace=grafana --show-only templates/monitoring-dashboard.yaml >"$work/dashboard.yaml"
  expect_eq "dashboard labels" "$(objects "$work/dashboard.yaml" '{{.metadata.namespace}} {{index .metadata.labels "dashboards"}} {{index .metadata.labels "grafana_dashboard"}}')" \
    "grafana kuport <no value>"
  # Every alert has a runbook section in docs/operations/alerts.md.
  local alert
  for alert in $(objects "$work/monitoring.yaml" '{{if eq .kind "PrometheusRule"}}{{range .spec.groups}}{{range .rules}}{{.alert}} {{end}}{{end}}{{end}}'); do
    grep -q "^## $alert\$" docs/operations/alerts.md || { echo "no section '## $alert' in docs/operations/alerts.md"; return 1; }
  done
}
check "monitoring: none by default; a ServiceMonitor, a PrometheusRule and a dashboard when enabled" monitoring_objects

# The rendered rule groups (the PrometheusRule's spec, as JSON, which promtool reads as YAML):
# valid for Prometheus, and each alert fires when it should and only then (alerts-test.yaml).
rules() {
  helm template "$release" "$chart" -n "$ns" --kube-version "$kube_version" "${monitoring_sets[@]}" \
    --show-only templates/monitoring-prometheusrule.yaml >"$work/rule.yaml"
  kubectl label --local -f "$work/rule.yaml" kuport-chart-test- -o jsonpath='{.spec}' >"$work/rules.json"
  promtool check rules "$work/rules.json"
  cp "$here/alerts-test.yaml" "$work/alerts-test.yaml"
  promtool test rules "$work/alerts-test.yaml"
}
check "promtool check rules and test rules pass on the rendered PrometheusRule" rules

monitoring_schema() {
  if helm template "$release" "$chart" --kube-version "$kube_version" --set monitoring.prometheusRule.disconnectedFor=5 >/dev/null 2>"$work/schema.err"; then
    echo "a duration without a unit was accepted"; return 1
  fi
  grep -q "disconnectedFor" "$work/schema.err" || { cat "$work/schema.err"; return 1; }
}
check "values.schema.json rejects a monitoring duration without a unit" monitoring_schema

# --------------------------------------------------------- against a real API server
t1=$(date +%s)
e2e/controlplane/up.sh "$state" >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$state/env" # KUBECONFIG, PATH
log "API server up in $(($(date +%s) - t1))s"

install() {
  helm install "$release" "$chart" -n "$ns" --create-namespace --wait=false | tee "$work/install.out"
  grep -q "kuportctl --controller https://127.0.0.1:9443 nodes" "$work/install.out"
  grep -q -- "--clusterrole=kuport-debug " "$work/install.out"
  grep -q "port-forward svc/kuport-controller 9443" "$work/install.out"
}
check "helm install (NOTES show kuportctl)" install

all_objects() {
  kubectl -n "$ns" get deploy/kuport-controller ds/kuport-node-exec svc/kuport-controller \
    sa/kuport-controller sa/kuport-node-exec role/kuport-controller-leader-election \
    rolebinding/kuport-controller-leader-election role/kuport-controller-tls rolebinding/kuport-controller-tls \
    pdb/kuport-controller
  kubectl get clusterrole/kuport-controller clusterrolebinding/kuport-controller clusterrole/kuport-debug \
    crd/portmapclasses.kuport.wlz.li crd/portmaps.kuport.wlz.li crd/intercepts.kuport.wlz.li
  kubectl wait --for=condition=Established --timeout=60s crd/portmapclasses.kuport.wlz.li crd/portmaps.kuport.wlz.li crd/intercepts.kuport.wlz.li
  expect_eq "service ports" "$(kubectl -n "$ns" get svc kuport-controller -o jsonpath='{range .spec.ports[*]}{.name}:{.port} {end}')" "grpc:9443 metrics:9090 "
  expect_eq "pdb" "$(kubectl -n "$ns" get pdb kuport-controller -o jsonpath='{.spec.minAvailable}')" 1
}
check "every object exists (deploy, ds, svc, sa, (cluster)role(binding), pdb, CRDs)" all_objects

# The API server's own RBAC evaluation, impersonating each ServiceAccount.
can() { # yes|no SA VERB RESOURCE [kubectl auth can-i flags]
  local want=$1 sa=$2 got
  shift 2
  got=$(kubectl auth can-i "$@" --as="system:serviceaccount:$ns:$sa" 2>/dev/null || true)
  [ "$got" = "$want" ] || { echo "can-i $* as $sa: got '$got', want '$want'"; return 1; }
}
rbac_live() {
  local c=kuport-controller e=kuport-node-exec r v bad=0
  for r in nodes namespaces services pods endpointslices.discovery.k8s.io portmapclasses.kuport.wlz.li portmaps.kuport.wlz.li intercepts.kuport.wlz.li; do
    for v in list watch; do can yes "$c" "$v" "$r" -A || bad=1; done
    # It never gets one by name, and writes none of them (a Node's overlay annotations only
    # with overlay.enabled, off here).
    for v in get create update patch delete; do can no "$c" "$v" "$r" -A || bad=1; done
  done
  can no "$c" patch nodes --subresource=status -A || bad=1
  for r in portmapclasses.kuport.wlz.li portmaps.kuport.wlz.li intercepts.kuport.wlz.li; do
    can yes "$c" patch "$r" --subresource=status -A || bad=1
    for v in get update; do can no "$c" "$v" "$r" --subresource=status -A || bad=1; done
  done
  for v in create patch; do can yes "$c" "$v" events.events.k8s.io -A || bad=1; done
  for v in get list update delete; do can no "$c" "$v" events.events.k8s.io -A || bad=1; done
  # The core events API is not used.
  for v in create patch; do can no "$c" "$v" events -A || bad=1; done
  # Leases: create in the release namespace; everything else on the controller's Lease only.
  can yes "$c" create leases.coordination.k8s.io -n "$ns" || bad=1
  for v in get patch list watch; do can yes "$c" "$v" leases.coordination.k8s.io/kuport-controller -n "$ns" || bad=1; done
  for v in get patch list watch; do can no "$c" "$v" leases.coordination.k8s.io/other -n "$ns" || bad=1; done
  for v in list watch update delete; do can no "$c" "$v" leases.coordination.k8s.io -n "$ns" || bad=1; done
  can no "$c" update leases.coordination.k8s.io/kuport-controller -n "$ns" || bad=1
  can no "$c" create leases.coordination.k8s.io -n default || bad=1
  can no "$c" get leases.coordination.k8s.io/kuport-controller -n default || bad=1
  for r in secrets configmaps; do can no "$c" get "$r" -A || bad=1; done
  # Reviews of its callers' tokens, and of their Debug access.
  can yes "$c" create tokenreviews.authentication.k8s.io || bad=1
  can yes "$c" create subjectaccessreviews.authorization.k8s.io || bad=1
  # Its own Secret and ConfigMap in the release namespace; no other, nowhere else.
  for v in get update list watch; do can yes "$c" "$v" secrets/kuport-controller-tls -n "$ns" || bad=1; done
  for v in get update; do can yes "$c" "$v" configmaps/kuport-ca -n "$ns" || bad=1; done
  for v in list watch; do can no "$c" "$v" configmaps/kuport-ca -n "$ns" || bad=1; done
  for r in secrets/kuport-controller-tls configmaps/kuport-ca; do
    for v in patch delete; do can no "$c" "$v" "$r" -n "$ns" || bad=1; done
    can no "$c" get "$r" -n default || bad=1
  done
  for r in secrets configmaps; do
    can yes "$c" create "$r" -n "$ns" || bad=1
    can no "$c" create "$r" -n default || bad=1
    for v in get list watch update; do can no "$c" "$v" "$r" -n "$ns" || bad=1; done
  done
  can no "$c" get secrets/other -n "$ns" || bad=1
  # The debug ClusterRole, as a user bound to it would hold it (nobody is, by the chart).
  expect_eq "debug rules" "$(kubectl get clusterrole kuport-debug -o jsonpath='{range .rules[*]}{.apiGroups} {.resources} {.verbs};{end}')" \
    '["kuport.wlz.li"] ["nodestates"] ["get","list"];["kuport.wlz.li"] ["portmaps"] ["get"];' || bad=1
  # The executor: nothing, cluster-wide or in its own namespace.
  for r in nodes pods services endpointslices.discovery.k8s.io portmapclasses.kuport.wlz.li portmaps.kuport.wlz.li; do
    can no "$e" get "$r" -A || bad=1
  done
  for r in leases.coordination.k8s.io pods secrets configmaps events; do
    for v in get create; do can no "$e" "$v" "$r" -n "$ns" || bad=1; done
  done
  # Nor may it review tokens (a stolen executor token does not open the API).
  can no "$e" create tokenreviews.authentication.k8s.io || bad=1
  can no "$e" get nodestates.kuport.wlz.li -A || bad=1
  return $bad
}
check "RBAC as the API server evaluates it (kubectl auth can-i --as each ServiceAccount)" rbac_live

examples() {
  # The two example classes, then the example workloads' Namespaces, Services, EndpointSlices
  # and PortMaps.
  kubectl apply -f examples/cluster/classes.yaml
  kubectl apply -f examples/cluster/web.yaml -f examples/cluster/game.yaml -f examples/cluster/dns.yaml
  kubectl get pmc,pm -A
  expect_eq "classes" "$(kubectl get pmc -o jsonpath='{.items[*].metadata.name}')" "intranet public"
  expect_eq "portmaps" "$(kubectl get pm -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {end}')" "games/game intranet/dns web/web "
  # The schema's defaults are applied (servingMode Single, ports 1..65535 unless given).
  expect_eq "defaults" "$(kubectl get pmc public -o jsonpath='{.spec.servingMode} {.spec.returnPath.vxlan.port}')" "Single 4790"
  # And the schema is enforced.
  if kubectl apply -f - <<'EOF' 2>"$work/bad.err"; then
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: bad, namespace: web}
spec: {className: public, port: 70000, protocol: SCTP, serviceRef: {name: web}}
EOF
    echo "an invalid PortMap was accepted"
    return 1
  fi
  grep -q "spec.protocol" "$work/bad.err" && grep -q "spec.port" "$work/bad.err" || { cat "$work/bad.err"; return 1; }
}
check "the CRDs accept the examples and reject an invalid PortMap" examples

custom_server() {
  # The custom render (privileged executor, NodePort, percentages, ...) passes the API server's
  # validation too.
  # (Less the ConfigMap kuport-teardown: its name is fixed in the controller, one kuport per
  # namespace, and the release installed above holds it.)
  awk 'BEGIN { RS = "\n---\n"; ORS = "\n---\n" } !/\nkind: ConfigMap\nmetadata:\n  name: kuport-teardown\n/' \
    "$work/custom.yaml" >"$work/custom-server.yaml"
  grep -q 'name: kuport-teardown' "$work/custom-server.yaml" && { echo "the teardown ConfigMap was not left out"; return 1; }
  kubectl create --dry-run=server -f "$work/custom-server.yaml" -o name
}
check "the custom render passes server-side validation (dry run)" custom_server

# The pre-delete hook (templates/teardown.yaml): its account, roles and Job made before the
# uninstall deletes anything, the Job after them; kuportctl teardown from the controller's image,
# finding the leader by the release's Lease and verifying it with the CA it mounts, run as the
# controller runs.
teardown_hook() { # FILE PREFIX CA_CONFIGMAP
  expect_eq "hooks" "$(objects "$1" '{{with .metadata.annotations}}{{with index . "helm.sh/hook"}}{{$.kind}}/{{$.metadata.name}} {{.}} {{index $.metadata.annotations "helm.sh/hook-weight"}} {{index $.metadata.annotations "helm.sh/hook-delete-policy"}}{{"\n"}}{{end}}{{end}}' | sort)" \
    "$(for o in ClusterRoleBinding Job Role RoleBinding ServiceAccount; do
      w=-10; [ "$o" = Job ] && w=0
      echo "$o/$2-teardown pre-delete $w before-hook-creation,hook-succeeded"
    done)"
  expect_eq "the Job" "$(objects "$1" '{{if eq .kind "Job"}}{{with .spec.template.spec}}{{.serviceAccountName}} {{.securityContext.runAsUser}} {{range .containers}}{{.image}} {{.command}} {{.args}} {{.securityContext.readOnlyRootFilesystem}} {{.securityContext.capabilities.drop}}{{end}} {{range .volumes}}{{.configMap.name}}{{end}}{{end}}{{end}}')" \
    "$2-teardown 65532 $4 [/usr/local/bin/kuportctl] [teardown --namespace $ns --lease-name $2-controller --ca-file /etc/kuport/ca/ca.crt --wait 120] true [ALL] $3"
}
check "uninstall's teardown: a pre-delete hook runs kuportctl teardown (default)" teardown_hook "$work/default.yaml" kuport kuport-ca "$(objects "$work/default.yaml" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{.image}}{{end}}{{end}}')"
check "uninstall's teardown: a pre-delete hook runs kuportctl teardown (custom)" teardown_hook "$work/custom.yaml" portmapper kuport-serving-ca "$(objects "$work/custom.yaml" '{{if eq .kind "Deployment"}}{{range .spec.template.spec.containers}}{{.image}}{{end}}{{end}}')"

upgrade() {
  helm upgrade "$release" "$chart" -n "$ns" --set controller.replicas=3 --set log.level=debug --wait=false >/dev/null
  expect_eq "release" "$(helm list -n "$ns" -o json | grep -o '"revision":"[0-9]*","updated":"[^"]*","status":"[a-z]*"' | sed 's/,"updated":"[^"]*"//')" \
    '"revision":"2","status":"deployed"'
  expect_eq "replicas" "$(kubectl -n "$ns" get deploy kuport-controller -o jsonpath='{.spec.replicas}')" 3
  kubectl -n "$ns" get deploy kuport-controller -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q '"--log-level","debug"'
  kubectl -n "$ns" get ds kuport-node-exec -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q '"--log-level","debug"'
  # Values not given are the chart defaults again, not the previous release's.
  expect_eq "spread" "$(kubectl -n "$ns" get deploy kuport-controller -o jsonpath='{.spec.template.spec.topologySpreadConstraints[0].topologyKey}')" kubernetes.io/hostname
}
check "helm upgrade (replicas 3, log level debug) is visible" upgrade

# Without a kubelet the pre-delete hook's Job would never run (e2e/realnode/chart.sh runs it on a
# real node): uninstalled without hooks here.
uninstall() {
  helm uninstall "$release" -n "$ns" --no-hooks
  local o left
  for o in deploy/kuport-controller ds/kuport-node-exec svc/kuport-controller sa/kuport-controller \
    sa/kuport-node-exec role/kuport-controller-leader-election rolebinding/kuport-controller-leader-election \
    role/kuport-controller-tls rolebinding/kuport-controller-tls pdb/kuport-controller \
    configmap/kuport-teardown role/kuport-controller-teardown rolebinding/kuport-controller-teardown; do
    if kubectl -n "$ns" get "$o" >/dev/null 2>&1; then echo "$o is left"; return 1; fi
  done
  for o in clusterrole/kuport-controller clusterrolebinding/kuport-controller clusterrole/kuport-debug; do
    if kubectl get "$o" >/dev/null 2>&1; then echo "$o is left"; return 1; fi
  done
  left=$(kubectl get deploy,ds,svc,sa,role,rolebinding,pdb,clusterrole,clusterrolebinding -A \
    -l app.kubernetes.io/instance="$release" -o name)
  [ -z "$left" ] || { echo "left with the release label:"; echo "$left"; return 1; }
  [ -z "$(helm list -n "$ns" -q)" ]
  # The CRDs stay, and with them the custom resources.
  kubectl get crd/portmapclasses.kuport.wlz.li crd/portmaps.kuport.wlz.li
  kubectl get pmc public intranet
  kubectl -n web get pm web
}
check "helm uninstall leaves the CRDs and nothing else of the release" uninstall
