#!/usr/bin/env bash
# kuport's two images, built from Containerfile and run with a real container runtime, and what
# the Containerfile and the chart promise of them checked on the running processes
# (docs/container.md, "Built and run here"). No registry is reachable here, so:
#   - the bases are assembled from Debian 12 packages (apt-get download, dpkg-deb), a stand-in
#     for distroless/cc-debian12 (docs/decisions.md, "The images' lab base"), imported as
#     localhost/kuport-base:cc (root) and :cc-nonroot (65532);
#   - the images are Containerfile's own targets `controller` and `node-exec` on those bases,
#     their `build` stage replaced by binaries cargo built here (`--build-context build=DIR`,
#     DIR/out holding both; the tests' build by default, KUPORT_IMAGE_PROFILE=release for the
#     release build): podman build, no Containerfile of the lab's own.
# Then, with podman and runc, in two network namespaces this script makes (a "node" and a
# "pod" joined by a veth; nothing listens on the host's own addresses):
#   - the lab's API server (e2e/controlplane/up.sh) in the pod namespace and the chart installed
#     on it; the containers get the chart's rendered arguments, environment, mounts and security
#     context (user, capabilities, read-only root, no privilege escalation) as podman flags;
#   - the controller as its Deployment runs it (its ServiceAccount's pod-bound token where a
#     kubelet mounts it): it leads, publishes its CA and serves TLS and metrics;
#   - the executor as its DaemonSet runs it (in the node's namespace, its pod-bound token, the
#     CA, a state directory): it connects, and its node acknowledges its desired state;
#   - then again with interception on (SYS_ADMIN, SYS_PTRACE, the host's PID namespace);
#   - checked from the host: each image's User and Entrypoint; each process's uid and gid, its
#     capability sets (/proc/PID/status) against the chart's list, no_new_privs and seccomp;
#     its root mounted read-only (mountinfo, and a write through /proc/PID/root refused);
#   - ablations: one capability more, one fewer (NET_ADMIN) and a writable root must fail.
# The images are saved as OCI archives for containerd (`ctr -n k8s.io images import`).
# Run as root: bash e2e/container/images.sh. It exits nonzero on any failed check.
# Cached in ${KUPORT_CACHE:-~/.cache/kuport}/container: podman's storage (the bases per hash of
# their packages' versions, the images per hash of bases, Containerfile and binaries) and the
# archives.
set -euo pipefail
cd "$(dirname "$0")/../.."
. e2e/deps.sh
. e2e/progress.sh
dir=$cache/container
mkdir -p "$dir"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "container: $*"; }
t0=$(now)

# --- host packages ----------------------------------------------------------------------------
# runc, not crun: this host's cgroups are v1 with a cgroup2 hierarchy beside them (hugetlb on
# it), which crun 1.8 refuses ("cgroups in hybrid mode not supported"). Both in one install, so
# that podman's `crun | runc` is met by runc.
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v curl >/dev/null || need+=(curl)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# podman with its own storage and settings, nothing from the host's configuration: overlay
# storage in the cache, cgroupfs (no systemd here), runc. Its default open-file limit exceeds
# this host's hard limit and root has no CAP_SYS_RESOURCE here to raise it (nor the process
# limit above podman's own): each container gets the host's open-file limit and 4096 processes.
store=$dir/storage
driver=overlay
[ "$(stat -f -c %T "$dir")" != overlayfs ] || driver=vfs # no overlay on overlayfs
pm() {
  podman --root "$store" --runroot /run/kuport-container --storage-driver "$driver" \
    --cgroup-manager cgroupfs --events-backend file --runtime runc "$@"
}
nofile=$(ulimit -Hn)
[ "$nofile" != unlimited ] || nofile=1048576
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)

version=$(awk '/^appVersion:/ { gsub(/"/, "", $2); print $2 }' charts/kuport/Chart.yaml)
controller_image=localhost/kuport-controller:$version
node_exec_image=localhost/kuport-node-exec:$version
base=localhost/kuport-base
arch=$(dpkg --print-architecture)

# A stamp file holds "key image-id": the image is current when both match.
current() { [ -f "$dir/$1.stamp" ] && read -r k id <"$dir/$1.stamp" && [ "$k" = "$2" ] && pm image exists "$id"; }
stamp() { echo "$2 $(pm image inspect --format '{{.Id}}' "$3")" >"$dir/$1.stamp"; }

# --- the bases, per hash of their packages' versions ------------------------------------------
# What distroless/cc-debian12 carries that a Rust binary uses: glibc and libgcc (unwinding), CA
# certificates, tzdata, netbase's /etc/services and /etc/protocols, base-files' os-release;
# /etc/passwd and /etc/group with root, nobody and nonroot (65532); no shell, no package
# manager. Not libssl3, libgomp1 or libstdc++6, which distroless/cc also has: the binaries link
# none of them (rustls with ring), and the runs below prove what they do link is there.
t=$(now)
packages=(base-files libc6 libgcc-s1 gcc-12-base ca-certificates netbase tzdata)
versions=$(apt-cache show --no-all-versions "${packages[@]}" 2>/dev/null | grep -E '^(Package|Version):') || true
if [ "$(grep -c '^Package:' <<<"$versions")" != "${#packages[@]}" ]; then
  apt-get update -qq
  versions=$(apt-cache show --no-all-versions "${packages[@]}" | grep -E '^(Package|Version):')
fi
# (this script too: it chooses what goes in)
base_key=$( (echo "$versions"; sed -n '/^# --- the bases/,/^# --- the images/p' "$0") | sha256sum | cut -c1-16)
if ! current base "$base_key" || ! current base-root "$base_key"; then
  say "assembling the base from ${packages[*]}"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/kuport-base.XXXXXX")
  root=$tmp/root
  mkdir -p "$tmp/deb" "$root"
  (cd "$tmp/deb" && apt-get download -o APT::Sandbox::User=root "${packages[@]}" >/dev/null 2>&1)
  for deb in "$tmp"/deb/*.deb; do dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$root"; done
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' 'networks: files' \
    'protocols: files' 'services: files' 'ethers: files' 'rpc: files' >"$root/etc/nsswitch.conf"
  # The bundle update-ca-certificates would make at install (every certificate the package
  # ships is enabled by default): maintainer scripts do not run here.
  mkdir -p "$root/etc/ssl/certs"
  find "$root/usr/share/ca-certificates" -name '*.crt' | sort | xargs cat >"$root/etc/ssl/certs/ca-certificates.crt"
  install -d -m 0700 -o 65532 -g 65532 "$root/home/nonroot"
  env=(--change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'ENV=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt')
  tar -C "$root" --numeric-owner -c . | pm import -q "${env[@]}" --change 'USER=0:0' --change 'WORKDIR=/' - "$base:cc" >/dev/null
  tar -C "$root" --numeric-owner -c . | pm import -q "${env[@]}" --change 'USER=65532:65532' --change 'WORKDIR=/home/nonroot' - "$base:cc-nonroot" >/dev/null
  rm -rf "$tmp"
  # Images built on an earlier base are rebuilt (their key names the base's).
  stamp base "$base_key" "$base:cc-nonroot"
  stamp base-root "$base_key" "$base:cc"
fi
say "bases $base:cc and :cc-nonroot ready in $(since "$t")s ($(pm image inspect --format '{{.Size}}' "$base:cc" | numfmt --to=iec))"

# --- the images -------------------------------------------------------------------------------
# The binaries: by default the ones `cargo test --workspace` builds for the tests (e2e/test.sh
# has just built them: nothing to compile; debug info stripped here, as a release build has
# none), with KUPORT_IMAGE_PROFILE=release the release build the Containerfile's build stage
# runs (the same command; minutes after a source change: docs/decisions.md, "The images' lab
# base"). Either links Debian 12's glibc, the bases' own.
t=$(now)
profile=${KUPORT_IMAGE_PROFILE:-test}
case "$profile" in
  test)
    progress -q "container: the binaries" "seconds after e2e/test.sh compiled the tests" \
      nice -n 10 cargo test --workspace --locked --no-run
    bins=("$CARGO_TARGET_DIR/debug/kuport-controller" "$CARGO_TARGET_DIR/debug/kuportctl" "$CARGO_TARGET_DIR/debug/kuport-node-exec") ;;
  release)
    progress -q "container: the release binaries" "minutes cold, seconds warm" \
      nice -n 10 cargo build --release --locked -p kuport-controller -p kuport-node-exec
    bins=("$CARGO_TARGET_DIR/release/kuport-controller" "$CARGO_TARGET_DIR/release/kuportctl" "$CARGO_TARGET_DIR/release/kuport-node-exec") ;;
  *) say "KUPORT_IMAGE_PROFILE=$profile: test or release"; exit 2 ;;
esac
for b in "${bins[@]}"; do [ -x "$b" ] || { say "FAILED: no $b"; exit 1; }; done
say "binaries ($profile build) ready in $(since "$t")s"

t=$(now)
image_key=$( (echo "$base_key $profile"; cat Containerfile; sha256sum "${bins[@]}" | cut -d' ' -f1) | sha256sum | cut -c1-16)
build_args=(--build-arg "CONTROLLER_BASE=$base:cc-nonroot" --build-arg "NODE_EXEC_BASE=$base:cc" --build-arg "TARGETARCH=$arch")
for target in controller node-exec; do
  image=localhost/kuport-$target:$version
  archive=$dir/kuport-$target-$version.oci.tar
  if ! current "$target" "$image_key"; then
    say "building $image (Containerfile, target $target)"
    ctx=$(mktemp -d "${TMPDIR:-/tmp}/kuport-image.XXXXXX")
    mkdir -p "$ctx/out" "$ctx/empty"
    for b in "${bins[@]}"; do strip --strip-debug -o "$ctx/out/${b##*/}" "$b"; done
    pm build -q -f Containerfile --target "$target" --build-context "build=$ctx" "${build_args[@]}" \
      -t "$image" "$ctx/empty" >/dev/null
    rm -rf "$ctx"
    rm -f "$archive"
    stamp "$target" "$image_key" "$image"
  fi
  if [ ! -s "$archive" ]; then
    pm save -q --format oci-archive -o "$archive.tmp" "$image"
    mv "$archive.tmp" "$archive"
  fi
done
pm image prune -f >/dev/null
say "images ready in $(since "$t")s: $controller_image $(pm image inspect --format '{{.Size}}' "$controller_image" | numfmt --to=iec)," \
  "$node_exec_image $(pm image inspect --format '{{.Size}}' "$node_exec_image" | numfmt --to=iec)"

# --- checks -----------------------------------------------------------------------------------
failed=0
fail() { say "FAILED: $*"; failed=1; }
pass() { say "ok: $*"; }
expect() { # WHAT GOT WANT
  if [ "$2" = "$3" ]; then pass "$1: $2"; else fail "$1: $2, expected $3"; fi
}

# Capability names of a /proc/PID/status mask, upper case as the chart writes them, sorted.
cap_names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
  LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE
  SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME
  SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG
  WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE)
caps() {
  local mask=$((16#$1)) i out=()
  for ((i = 0; i < 64; i++)); do
    (((mask >> i) & 1)) && out+=("${cap_names[i]:-CAP$i}")
  done
  ((${#out[@]})) || { echo none; return; }
  printf '%s\n' "${out[@]}" | sort | paste -sd' '
}
field() { awk -v f="$1:" '$1 == f { $1 = ""; sub(/^ /, ""); print }' "/proc/$2/status"; }

# The process a container runs, from the host: its user, groups, capabilities and root.
# `expect_user` is "UID:GID", `expect_caps` the sorted names (or none).
check_process() {
  local what=$1 pid=$2 expect_user=$3 expect_caps=$4 set
  local uid=${expect_user%:*} gid=${expect_user#*:}
  expect "$what: exe" "$(readlink "/proc/$pid/exe")" "$5"
  expect "$what: Uid (real, effective, saved, fs)" "$(field Uid "$pid" | tr -s '\t ' ' ')" "$uid $uid $uid $uid"
  expect "$what: Gid" "$(field Gid "$pid" | tr -s '\t ' ' ')" "$gid $gid $gid $gid"
  # (the runtime adds the primary group, as containerd's CRI does: nothing else)
  expect "$what: supplementary groups" "$(field Groups "$pid" | xargs)" "$gid"
  for set in CapEff CapPrm CapBnd; do
    expect "$what: $set" "$(caps "$(field $set "$pid")")" "$expect_caps"
  done
  expect "$what: CapInh, CapAmb" "$(caps "$(field CapInh "$pid")"), $(caps "$(field CapAmb "$pid")")" "none, none"
  expect "$what: NoNewPrivs (allowPrivilegeEscalation: false)" "$(field NoNewPrivs "$pid")" 1
  expect "$what: Seccomp (RuntimeDefault: a filter)" "$(field Seccomp "$pid")" 2
  check_readonly "$what" "$pid"
}
# The namespace the process runs in: NAME's (/run/netns/NAME), or the host's (self).
check_ns() { # WHAT PID KIND NAME
  local want
  if [ "$4" = host ]; then want=$(stat -L -c %i "/proc/self/ns/$3"); else want=$(stat -L -c %i "/run/netns/$4"); fi
  expect "$1: $3 namespace" "$(stat -L -c %i "/proc/$2/ns/$3")" "$want"
}
# The root is a read-only mount (mountinfo's per-mount options) and a write through the
# process's root is refused, even for the host's root.
check_readonly() {
  local what=$1 pid=$2 opts err
  opts=$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo")
  case ",$opts," in
    *,ro,*) pass "$what: / mounted $opts" ;;
    *) fail "$what: / mounted ${opts:-?}, not read-only" ;;
  esac
  if err=$( (: >"/proc/$pid/root/usr/local/bin/.kuport-write-probe") 2>&1); then
    rm -f "/proc/$pid/root/usr/local/bin/.kuport-write-probe"
    fail "$what: a write to its /usr/local/bin succeeded"
  else
    case "$err" in
      *"Read-only file system"*) pass "$what: a write to its /usr/local/bin: Read-only file system" ;;
      *) fail "$what: a write to its /usr/local/bin failed otherwise: $err" ;;
    esac
  fi
}

# The images' configurations: what the Containerfile says, and what the chart relies on.
t=$(now)
cfg() { pm image inspect --format "$1" "$2"; }
expect "controller image: User" "$(cfg '{{.Config.User}}' "$controller_image")" 65532:65532
expect "controller image: Entrypoint, Cmd" "$(cfg '{{.Config.Entrypoint}} {{.Config.Cmd}}' "$controller_image")" "[/usr/local/bin/kuport-controller] []"
expect "controller image: ExposedPorts" "$(cfg '{{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}' "$controller_image" | xargs)" "9090/tcp 9443/tcp"
expect "node-exec image: User" "$(cfg '{{.Config.User}}' "$node_exec_image")" 0:0
expect "node-exec image: Entrypoint, Cmd" "$(cfg '{{.Config.Entrypoint}} {{.Config.Cmd}}' "$node_exec_image")" "[/usr/local/bin/kuport-node-exec] []"
for image in "$controller_image" "$node_exec_image"; do
  # No shell and no package manager, as distroless: nothing to exec into.
  mnt=$(pm image mount "$image")
  found=$(cd "$mnt" && ls -d bin/sh bin/bash usr/bin/sh usr/bin/dpkg usr/bin/apt 2>/dev/null | xargs) || true
  pm image unmount "$image" >/dev/null
  expect "$image: shell or package manager" "${found:-none}" none
done
# Linked and runnable as the image's user (the executor's CLI has no --version).
out=$(pm run --rm --network none "${limits[@]}" "$controller_image" --version 2>&1) || true
expect "$controller_image --version" "$out" "kuport-controller $version"
# kuportctl too: the chart's pre-delete hook runs `kuportctl teardown` from this image.
out=$(pm run --rm --network none "${limits[@]}" --entrypoint /usr/local/bin/kuportctl "$controller_image" --version 2>&1) || true
expect "$controller_image kuportctl --version" "$out" "kuportctl $version"
out=$(pm run --rm --network none "${limits[@]}" "$node_exec_image" --help 2>&1) || true
expect "$node_exec_image --help, first line" "${out%%$'\n'*}" "Makes this node's kernel match its kuport state"
say "image checks in $(since "$t")s"

# --- the chart's pods, run by podman ----------------------------------------------------------
# Two namespaces joined by a veth: the node (198.18.30.1, its default route over the veth), where
# the executor runs as with hostNetwork, and a pod (198.18.30.2), where the lab's API server
# listens on the pod's loopback and the controller runs. Nothing listens on the host's addresses.
t=$(now)
work=$(mktemp -d "${TMPDIR:-/tmp}/kuport-container.XXXXXX")
node_ns=kuport-img-$$-node
pod_ns=kuport-img-$$-pod
node_ip=198.18.30.1
pod_ip=198.18.30.2
node=img-node
ns=kuport-system
containers=()
# What a run killed before its cleanup left: containers and namespaces of a process now gone.
for c in $(pm ps -a --format '{{.Names}}' | grep '^kuport-img-[0-9]*-' || true) $(ip netns list | grep -o '^kuport-img-[0-9]*-[a-z]*' || true); do
  p=${c#kuport-img-}
  p=${p%%-*}
  kill -0 "$p" 2>/dev/null && continue
  case "$c" in
    *-node | *-pod) ip netns del "$c" 2>/dev/null || true ;;
    *) pm rm -f -t 1 "$c" >/dev/null 2>&1 || true ;;
  esac
done
cleanup() {
  local rc=$? c
  for c in "${containers[@]}"; do pm rm -f -t 1 "$c" >/dev/null 2>&1 || true; done
  [ ! -f "$work/controlplane/.kuport-controlplane" ] || e2e/controlplane/down.sh "$work/controlplane" >/dev/null 2>&1 || true
  ip netns del "$node_ns" 2>/dev/null || true
  ip netns del "$pod_ns" 2>/dev/null || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
ip netns add "$node_ns"
ip netns add "$pod_ns"
ip link add name eth0 netns "$node_ns" type veth peer name eth0 netns "$pod_ns"
for n in "$node_ns" "$pod_ns"; do ip -n "$n" link set lo up; ip -n "$n" link set eth0 up; done
ip -n "$node_ns" addr add "$node_ip/24" dev eth0
ip -n "$pod_ns" addr add "$pod_ip/24" dev eth0
ip -n "$node_ns" route add default via "$pod_ip"
# A node with a pod network forwards; the executor only reads this (values.yaml, nodeExec.privileged).
ip netns exec "$node_ns" sysctl -qw net.ipv4.ip_forward=1

if ! ip netns exec "$pod_ns" e2e/controlplane/up.sh "$work/controlplane" >/dev/null 2>"$work/up.log"; then
  cat "$work/up.log"
  exit 1
fi
. "$work/controlplane/env" # KUBECONFIG, KUPORT_BIN, KUPORT_APISERVER_URL
up_took=$(since "$t")
kc() { ip netns exec "$pod_ns" "$KUPORT_BIN/kubectl" "$@"; }
export HELM_CONFIG_HOME=$work/helm/config HELM_CACHE_HOME=$work/helm/cache HELM_DATA_HOME=$work/helm/data
helm() { ip netns exec "$pod_ns" "$KUPORT_BIN/helm" "$@"; }
# (helm's stderr: the API server's warnings about the CRDs' integer formats)
helm install kuport charts/kuport -n "$ns" --create-namespace --wait=false >/dev/null 2>"$work/helm.log" || { cat "$work/helm.log"; exit 1; }
say "API server up in the pod namespace in ${up_took}s; with the chart installed, $(since "$t")s"

# The node and the two pods the Deployment and DaemonSet would have (no kubelet or scheduler
# runs): the pods exist so that each token is bound to one, as a kubelet's is.
t=$(now)
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $node, labels: {kubernetes.io/hostname: $node, kubernetes.io/os: linux}}
---
apiVersion: v1
kind: Pod
metadata: {name: kuport-controller-img, namespace: $ns}
spec: {nodeName: $node, serviceAccountName: kuport-controller, containers: [{name: controller, image: $controller_image}]}
---
apiVersion: v1
kind: Pod
metadata: {name: kuport-node-exec-img, namespace: $ns}
spec: {nodeName: $node, serviceAccountName: kuport-node-exec, automountServiceAccountToken: false, containers: [{name: node-exec, image: $node_exec_image}]}
YAML
kc patch node "$node" --subresource=status --type=merge \
  -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$node_ip\"}],\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}" >/dev/null

# What the chart rendered for a workload's one container, as podman flags: the security
# context, the network and PID namespaces, the fieldRef environment, and the volumes, each
# mapped to what a kubelet would mount (a volume this script does not know fails the run).
# Sets `flags`, `args` (the container's args with $(VAR) expanded as a kubelet does), `user`
# (runAsUser:runAsGroup) and `want_caps` (the added capabilities, sorted, or none).
declare -A sources # volume name -> host path
render() {
  local kind=$1 pod=$2 c='.spec.template.spec.containers[0]' s='.spec.template.spec'
  jp() { kc -n "$ns" get "$kind" -o "jsonpath=$1"; }
  flags=() args=()
  local -A env=()
  local name path arg v ro drop add
  while IFS='=' read -r name path; do
    case "$path" in
      metadata.name) env[$name]=$pod ;;
      metadata.namespace) env[$name]=$ns ;;
      status.podIP) [ "$(jp "{$s.hostNetwork}")" = true ] && env[$name]=$node_ip || env[$name]=$pod_ip ;;
      spec.nodeName) env[$name]=$node ;;
      *) fail "$kind: env $name from $path: not emulated"; return 1 ;;
    esac
    flags+=(--env "$name=${env[$name]}")
  done < <(jp "{range $c.env[*]}{.name}={.valueFrom.fieldRef.fieldPath}{\"\n\"}{end}")
  while IFS= read -r arg; do
    for name in "${!env[@]}"; do arg=${arg//\$($name)/${env[$name]}}; done
    args+=("$arg")
  done < <(jp "{range $c.args[*]}{@}{\"\n\"}{end}")
  if [ "$(jp "{$s.hostNetwork}")" = true ]; then flags+=(--network "ns:/run/netns/$node_ns"); else flags+=(--network "ns:/run/netns/$pod_ns"); fi
  [ "$(jp "{$s.hostPID}")" != true ] || flags+=(--pid host)
  user="$(jp "{$c.securityContext.runAsUser}")"
  [ -n "$user" ] || user=$(jp "{$s.securityContext.runAsUser}")
  v=$(jp "{$c.securityContext.runAsGroup}")
  [ -n "$v" ] || v=$(jp "{$s.securityContext.runAsGroup}")
  user=$user:$v
  [ "$(jp "{$c.securityContext.privileged}")" != true ] || flags+=(--privileged)
  [ "$(jp "{$c.securityContext.readOnlyRootFilesystem}")" != true ] || flags+=(--read-only --read-only-tmpfs=false)
  [ "$(jp "{$c.securityContext.allowPrivilegeEscalation}")" != false ] || flags+=(--security-opt no-new-privileges)
  for drop in $(jp "{$c.securityContext.capabilities.drop[*]}"); do flags+=(--cap-drop "$drop"); done
  want_caps=$(jp "{$c.securityContext.capabilities.add[*]}" | tr ' ' '\n' | grep . | sort | paste -sd' ') || true
  want_caps=${want_caps:-none}
  for add in $(jp "{$c.securityContext.capabilities.add[*]}"); do flags+=(--cap-add "$add"); done
  v=$(jp "{$s.securityContext.seccompProfile.type}")
  [ "$v" = RuntimeDefault ] || { fail "$kind: seccomp profile '$v': not emulated"; return 1; }
  # The ServiceAccount token a kubelet mounts unless told not to.
  [ "$(jp "{$s.automountServiceAccountToken}")" = false ] ||
    flags+=(-v "${sources[kube-api-access]}:/var/run/secrets/kubernetes.io/serviceaccount:ro")
  local propagation opts
  while IFS='|' read -r name path ro propagation; do
    [ -n "$name" ] || continue
    [ -n "${sources[$name]:-}" ] || { fail "$kind: volume $name: not emulated"; return 1; }
    opts=$([ "$ro" = true ] && echo ro || echo rw)
    case "$propagation" in
      "" | None) ;;
      HostToContainer) opts+=,rslave ;;
      *) fail "$kind: volume $name: mountPropagation $propagation not emulated"; return 1 ;;
    esac
    flags+=(-v "${sources[$name]}:$path:$opts")
  done < <(jp "{range $c.volumeMounts[*]}{.name}|{.mountPath}|{.readOnly}|{.mountPropagation}{\"\n\"}{end}")
}

# The controller's ServiceAccount token, bound to its pod, with the API server's CA and the
# namespace, where a kubelet puts them; and the Service environment a kubelet gives every pod.
api=${KUPORT_APISERVER_URL#https://}
install -d -m 0755 "$work/sa" "$work/token" "$work/ca" "$work/state"
kc -n "$ns" create token kuport-controller --bound-object-kind Pod --bound-object-name kuport-controller-img --duration 1h >"$work/sa/token"
cp "$work/controlplane/pki/ca.crt" "$work/sa/ca.crt"
echo -n "$ns" >"$work/sa/namespace"
chmod 0644 "$work/sa"/*
sources[kube-api-access]=$work/sa
sources[state]=$work/state
sources[token]=$work/token
sources[ca]=$work/ca
sources[netns]=/run/netns
service_env=(--env "KUBERNETES_SERVICE_HOST=${api%:*}" --env "KUBERNETES_SERVICE_PORT=${api##*:}")
say "node, pods and tokens in $(since "$t")s"

# Polls `what` (a command) for up to 60 s.
wait_for() {
  local what=$1 deadline=$(($(date +%s) + 60))
  shift
  until "$@" >/dev/null 2>&1; do
    (($(date +%s) < deadline)) || { fail "$what: not within 60 s"; return 1; }
    sleep 0.2
  done
}
pid_of() { pm inspect --format '{{.State.Pid}}' "$1"; }
metrics() { ip netns exec "$node_ns" curl -fsS --max-time 2 "http://$pod_ip:$metrics_port/metrics"; }
has_metric() { metrics | grep -qx "$1"; }

# --- the controller, as its Deployment runs it ------------------------------------------------
t=$(now)
render deployment/kuport-controller kuport-controller-img
port() { kc -n "$ns" get deployment/kuport-controller -o "jsonpath={.spec.template.spec.containers[0].ports[?(@.name==\"$1\")].containerPort}"; }
metrics_port=$(port metrics)
grpc_port=$(port grpc)
expect "chart: the controller's runAsUser:runAsGroup, the image's User" "$user" "$(cfg '{{.Config.User}}' "$controller_image")"
ctl=kuport-img-$$-controller
containers+=("$ctl")
pm run -d --name "$ctl" "${limits[@]}" "${flags[@]}" "${service_env[@]}" "$controller_image" "${args[@]}" >/dev/null
ctl_flags=("${flags[@]}") ctl_args=("${args[@]}")
# The holder names the replica (its pod) and where executors reach it (--advertise).
lease_holder() { [ "$(kc -n "$ns" get lease kuport-controller -o 'jsonpath={.spec.holderIdentity}')" = "kuport-controller-img@$pod_ip:$grpc_port" ]; }
ca_published() { kc -n "$ns" get configmap kuport-ca -o 'jsonpath={.data.ca\.crt}' | grep -q 'BEGIN CERTIFICATE'; }
if wait_for "the controller holds the Lease" lease_holder && wait_for "the controller publishes its CA (ConfigMap kuport-ca)" ca_published &&
  wait_for "the controller's metrics say it leads" has_metric 'kuport_leader 1'; then
  pass "controller: leads (Lease kuport-controller held by kuport-controller-img@$pod_ip:$grpc_port), published its CA, serves /metrics on $pod_ip:$metrics_port, in $(since "$t")s"
fi
check_process controller "$(pid_of "$ctl")" "$user" "$want_caps" /usr/local/bin/kuport-controller
check_ns controller "$(pid_of "$ctl")" net "$pod_ns"

# --- the executor, as its DaemonSet runs it ---------------------------------------------------
# Its pod-bound token for the chart's audience and the CA the controller published, where the
# chart's projected and ConfigMap volumes put them; the Service's name resolved as cluster DNS
# would (an /etc/hosts entry).
run_executor() { # NAME EXTRA-FLAGS...
  local name=$1 controller host
  shift
  controller=$(printf '%s\n' "${args[@]}" | grep -m1 '^https://')
  host=${controller#https://}
  host=${host%:*}
  containers+=("$name")
  pm run -d --name "$name" "${limits[@]}" "${flags[@]}" --add-host "$host:$pod_ip" "$@" "$node_exec_image" "${args[@]}" >/dev/null
}
in_sync() { has_metric "kuport_node_in_sync{node=\"$node\"} 1" && has_metric "kuport_node_connected{node=\"$node\"} 1"; }
t=$(now)
audience=$(kc -n "$ns" get daemonset/kuport-node-exec -o 'jsonpath={.spec.template.spec.volumes[?(@.name=="token")].projected.sources[0].serviceAccountToken.audience}')
kc -n "$ns" create token kuport-node-exec --audience "$audience" --bound-object-kind Pod --bound-object-name kuport-node-exec-img --duration 1h >"$work/token/token"
kc -n "$ns" get configmap kuport-ca -o 'jsonpath={.data.ca\.crt}' >"$work/ca/ca.crt"
render daemonset/kuport-node-exec kuport-node-exec-img
expect "chart: the executor's runAsUser:runAsGroup, the image's User" "$user" "$(cfg '{{.Config.User}}' "$node_exec_image")"
expect "chart: the executor's capabilities" "$want_caps" NET_ADMIN
exe=kuport-img-$$-node-exec
run_executor "$exe"
exe_flags=("${flags[@]}") exe_args=("${args[@]}")
if wait_for "the executor's node in sync" in_sync; then
  pass "executor: connected over TLS with its token, node $node acknowledged its desired state, in $(since "$t")s"
fi
# Its last applied state, kept in the hostPath while its root is read-only.
if [ -s "$work/state/applied.pb" ]; then pass "executor: its applied state stored in the state directory (applied.pb, $(stat -c %s "$work/state/applied.pb") bytes)"; else fail "executor: no applied.pb in its state directory"; fi

# A PortMap the executor must program with what the chart grants it: published on the node's
# eth0 to a pod on the node (Single mode, no link). The pod's route is a bridge CNI's (cni0 with
# the node's pod CIDR); its Pod object vouches for its address (no kubelet: the status is written
# here), nothing runs in it: the rules are what is checked.
t=$(now)
ip -n "$node_ns" link add cni0 type bridge
ip -n "$node_ns" addr add 10.244.0.1/24 dev cni0
ip -n "$node_ns" link set cni0 up
kc patch node "$node" --type=merge -p '{"spec":{"podCIDR":"10.244.0.0/24","podCIDRs":["10.244.0.0/24"]}}' >/dev/null
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: games}
---
apiVersion: v1
kind: Pod
metadata: {name: game-0, namespace: games, labels: {app: game}}
spec: {nodeName: $node, automountServiceAccountToken: false, containers: [{name: game, image: game}]}
---
apiVersion: v1
kind: Service
metadata: {name: game, namespace: games}
spec:
  selector: {app: game}
  ports: [{name: game, protocol: UDP, port: 27015}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: game-img, namespace: games, labels: {kubernetes.io/service-name: game}}
addressType: IPv4
ports: [{name: game, protocol: UDP, port: 27015}]
endpoints:
  - addresses: [10.244.0.7]
    conditions: {ready: true}
    nodeName: $node
    targetRef: {kind: Pod, namespace: games, name: game-0}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: img}
spec:
  nodes:
    $node: {interfaces: [eth0]}
  ports: {min: 1024, max: 65535}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: game, namespace: games}
spec: {className: img, protocol: UDP, port: 27015, serviceRef: {name: game, port: game}}
YAML
kc -n games patch pod game-0 --subresource=status --type=merge -p '{"status":{"phase":"Running","podIP":"10.244.0.7","podIPs":[{"ip":"10.244.0.7"}],"conditions":[{"type":"Ready","status":"True"}]}}' >/dev/null
programmed() { [ "$(kc -n games get portmap game -o 'jsonpath={.status.conditions[?(@.type=="Programmed")].status}')" = True ]; }
kuport_tables() { ip netns exec "$node_ns" nft list tables | grep kuport | xargs; }
if wait_for "PortMap games/game Programmed" programmed; then
  pass "executor: PortMap games/game Programmed on $node in $(since "$t")s; the node's tables: $(kuport_tables)"
fi
check_process node-exec "$(pid_of "$exe")" "$user" "$want_caps" /usr/local/bin/kuport-node-exec
check_ns node-exec "$(pid_of "$exe")" net "$node_ns"

# --- interception on: the executor with the chart's extra grants ------------------------------
# `helm upgrade` as a user would; the DaemonSet's new pod replaces the old one. No CRI socket
# here (the chart's hostPath of type Socket would keep the pod from starting), so none is named.
t=$(now)
pm rm -f -t 1 "$exe" >/dev/null
wait_for "the executor's stream closed" has_metric "kuport_node_connected{node=\"$node\"} 0" || true
helm upgrade kuport charts/kuport -n "$ns" --reuse-values --set interception.enabled=true --set interception.criSocket= --wait=false >/dev/null 2>"$work/helm.log" || { cat "$work/helm.log"; exit 1; }
render daemonset/kuport-node-exec kuport-node-exec-img
expect "chart, interception on: the executor's capabilities" "$want_caps" "NET_ADMIN SYS_ADMIN SYS_PTRACE"
expect "chart, interception on: the executor's PID namespace" "$(kc -n "$ns" get daemonset/kuport-node-exec -o 'jsonpath={.spec.template.spec.hostPID}')" true
run_executor "$exe-interception"
if wait_for "the executor's node in sync again, interception on" in_sync; then
  pass "executor, interception on: node $node in sync again, in $(since "$t")s"
fi
check_process "node-exec (interception)" "$(pid_of "$exe-interception")" "$user" "$want_caps" /usr/local/bin/kuport-node-exec
check_ns "node-exec (interception)" "$(pid_of "$exe-interception")" pid host
pm rm -f -t 1 "$exe-interception" >/dev/null

# --- ablations: the checks notice ---------------------------------------------------------------
# Each runs a check on a container started one way wrong and must see it fail.
ablate() { # WHAT CHECK-FUNCTION ARGS...
  local what=$1 out
  shift
  if out=$(failed=0; "$@"; exit "$failed"); then
    fail "ablation, $what: the checks passed"
  else
    pass "ablation, $what: the checks fail ($(grep -m1 FAILED <<<"$out" | sed 's/^container: FAILED: //'))"
  fi
}
t=$(now)
flags=("${exe_flags[@]}") args=("${exe_args[@]}")
run_executor "$exe-ablation" --cap-add SYS_TIME
ablate "the executor with SYS_TIME added" check_process node-exec "$(pid_of "$exe-ablation")" 0:0 NET_ADMIN /usr/local/bin/kuport-node-exec
pm rm -f -t 1 "$exe-ablation" >/dev/null
# One capability fewer: without NET_ADMIN the executor cannot program the node. The table goes
# first, and the executor starts as on a new node (an empty state directory), so the controller
# sends it the state: it refuses it (a NACK) and writes nothing.
nacks() { metrics | awk '$1 == "kuport_nacks_total" { print $2 }'; }
before=$(nacks)
ip netns exec "$node_ns" nft delete table inet kuport
install -d -m 0755 "$work/state-capless"
capless=()
for ((i = 0; i < ${#exe_flags[@]}; i++)); do
  f=${exe_flags[i]}
  if [ "$f" = --cap-add ] && [ "${exe_flags[i + 1]}" = NET_ADMIN ]; then
    i=$((i + 1))
  else
    [ "${f#"$work/state:"}" = "$f" ] || f=$work/state-capless:${f#"$work/state:"}
    capless+=("$f")
  fi
done
flags=("${capless[@]}")
run_executor "$exe-capless"
refused() { (($(nacks) > before)); }
if wait_for "the executor without NET_ADMIN refuses its state" refused; then
  tables=$(kuport_tables) || true
  pass "ablation, the executor without NET_ADMIN: its state refused (kuport_nacks_total $before -> $(nacks)), kuport's tables on the node: ${tables:-none}"
  [ -z "$tables" ] || fail "ablation, the executor without NET_ADMIN: kuport's tables exist: $tables"
fi
pm rm -f -t 1 "$exe-capless" "$ctl" >/dev/null
writable=()
for f in "${ctl_flags[@]}"; do [ "$f" = --read-only ] || writable+=("$f"); done
containers+=("$ctl-ablation")
pm run -d --name "$ctl-ablation" "${limits[@]}" "${writable[@]}" "${service_env[@]}" "$controller_image" "${ctl_args[@]}" >/dev/null
ablate "the controller without --read-only" check_readonly controller "$(pid_of "$ctl-ablation")"
say "ablations in $(since "$t")s"

# --- the verdict ------------------------------------------------------------------------------
if ((failed)); then
  for c in "${containers[@]}"; do
    ! pm container exists "$c" || pm logs "$c" 2>&1 | tail -n 30 | sed "s/^/$c: /"
  done
  say "FAILED after $(since "$t0")s"
else
  say "passed in $(since "$t0")s: both images built from Containerfile, run as the chart runs them, their users, capabilities and read-only roots checked; the ablations fail"
  say "OCI archives (ctr -n k8s.io images import FILE): $dir/kuport-controller-$version.oci.tar ($controller_image), $dir/kuport-node-exec-$version.oci.tar ($node_exec_image)"
fi
exit "$failed"
