#!/usr/bin/env bash
# Build (or reuse from cache) the control-plane binaries for the kuport lab:
#   kube-apiserver, kubectl  <- k8s.io/kubernetes        (go/kube/go.mod)
#   kubelet, kube-controller-manager, kube-scheduler (only when named: e2e/realnode)
#                            <- k8s.io/kubernetes, the same module
#   etcd                     <- go.etcd.io/etcd/server/v3 (go/etcd/go.mod)
#   helm                     <- helm.sh/helm/v3/cmd/helm  (go/helm/go.mod)
# Everything comes from the Go module proxy at the versions pinned in the
# go.mod/go.sum files next to this script. No Docker, no release downloads.
#
# Usage: build.sh [--force] [NAME...]     (NAME: kube-apiserver kubectl etcd helm kubelet
#                                           kube-controller-manager kube-scheduler)
#   With no NAME, builds the first four. Binaries that are already cached with a
#   matching stamp are reused instantly; a change to a go.mod/go.sum (a version
#   bump), to the Go version or to the build flags rebuilds them.
#   The bin dir is printed as the last line on stdout; messages go to stderr.
#
# Environment:
#   KUPORT_CACHE   cache root (default: $HOME/.cache/kuport); binaries go to
#                  $KUPORT_CACHE/bin, stamps to $KUPORT_CACHE/bin/.stamp/NAME,
#                  a summary of all pins to $KUPORT_CACHE/bin/STAMP.
#   KUPORT_GO_NICE niceness for the go builds (default 19).
#   The Go build and module caches are Go's defaults (GOCACHE, GOMODCACHE).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUPORT_CACHE:-$HOME/.cache/kuport}"
BIN="$CACHE/bin"
NICE="${KUPORT_GO_NICE:-19}"

log() { printf '[build] %s\n' "$*" >&2; }
# shellcheck source=e2e/progress.sh
. "$HERE/../progress.sh"
die() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

FORCE=0
NAMES=()
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    kube-apiserver|kubectl|etcd|helm|kubelet|kube-controller-manager|kube-scheduler) NAMES+=("$a") ;;
    *) die "unknown argument '$a' (expected --force or one of: kube-apiserver kubectl etcd helm kubelet kube-controller-manager kube-scheduler)" ;;
  esac
done
[ "${#NAMES[@]}" -gt 0 ] || NAMES=(kube-apiserver kubectl etcd helm)

command -v go >/dev/null 2>&1 || die "go not found in PATH (need Go >= 1.26; see e2e/README.md)"

# name -> "<module dir under go/>|<main package>|<pinned module for the stamp>"
spec() {
  case "$1" in
    kube-apiserver) echo "kube|k8s.io/kubernetes/cmd/kube-apiserver|k8s.io/kubernetes" ;;
    kubectl)        echo "kube|k8s.io/kubernetes/cmd/kubectl|k8s.io/kubernetes" ;;
    kubelet)        echo "kube|k8s.io/kubernetes/cmd/kubelet|k8s.io/kubernetes" ;;
    kube-controller-manager) echo "kube|k8s.io/kubernetes/cmd/kube-controller-manager|k8s.io/kubernetes" ;;
    kube-scheduler) echo "kube|k8s.io/kubernetes/cmd/kube-scheduler|k8s.io/kubernetes" ;;
    etcd)           echo "etcd|go.etcd.io/etcd/server/v3|go.etcd.io/etcd/server/v3" ;;
    helm)           echo "helm|helm.sh/helm/v3/cmd/helm|helm.sh/helm/v3" ;;
  esac
}

# How long a build usually takes on two busy cores, cold, in the order of NAMES: kubectl reuses
# most of kube-apiserver's packages (e2e/README.md, "Control plane").
usual() {
  case "$1" in
    kube-apiserver) echo "about 22 min cold" ;;
    kubectl) echo "about 1.5 min after kube-apiserver, 10 min alone" ;;
    etcd) echo "about 2 min cold" ;;
    helm) echo "about 4.5 min cold" ;;
    kubelet) echo "about 6 min after kube-apiserver" ;;
    kube-controller-manager) echo "about 75 s after kube-apiserver" ;;
    kube-scheduler) echo "about 20 s after kube-controller-manager" ;;
  esac
}

GO_VERSION="$(go env GOVERSION)"
GOOS="$(go env GOOS)"
GOARCH="$(go env GOARCH)"
LDFLAGS="-s -w"
BUILD_FLAGS="-trimpath -mod=readonly -buildvcs=false"

pinned_version() { # module-dir module
  local v
  v="$(awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$HERE/go/$1/go.mod")"
  [ -n "$v" ] || die "cannot find the pinned version of $2 in go/$1/go.mod"
  echo "$v"
}

# -ldflags for one binary. Kubernetes binaries built outside its git tree say
# "v0.0.0-master+$Format:%H$" unless the version is stamped the way
# hack/lib/version.sh does it; kubectl even refuses to run `version` then.
ldflags_for() { # name version
  local ld="$LDFLAGS" v="$2" major minor p
  case "$1" in
    kube-apiserver|kubectl|kubelet|kube-controller-manager|kube-scheduler)
      major="${v#v}"; major="${major%%.*}"
      minor="${v#v*.}"; minor="${minor%%.*}"
      for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ld="$ld -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
      done ;;
    helm) # as helm's Makefile does; the source only carries "v3.<minor>"
      ld="$ld -X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
  esac
  echo "$ld"
}

# The stamp line for one binary: everything that should trigger a rebuild.
stamp_line() {
  local name="$1" dir pkg mod ver sum
  IFS='|' read -r dir pkg mod <<<"$(spec "$name")"
  ver="$(pinned_version "$dir" "$mod")"
  sum="$(cat "$HERE/go/$dir/go.mod" "$HERE/go/$dir/go.sum" | sha256sum | cut -c1-16)"
  echo "$name $mod@$ver $GO_VERSION $GOOS/$GOARCH cgo=0 flags=[$BUILD_FLAGS -ldflags=$(ldflags_for "$name" "$ver")] gomod+gosum=$sum"
}

mkdir -p "$BIN/.stamp"

is_cached() { # name stamp-line
  [ "$FORCE" = 0 ] && [ -x "$BIN/$1" ] && [ -f "$BIN/.stamp/$1" ] \
    && [ "$(cat "$BIN/.stamp/$1")" = "$2" ]
}

LOCKED=0
built=0
for name in "${NAMES[@]}"; do
  want="$(stamp_line "$name")"
  if is_cached "$name" "$want"; then
    log "$name: cached ($(cut -d' ' -f2 <<<"$want"))"
    continue
  fi
  # Serialise builds of concurrent build.sh runs sharing this cache (cached
  # binaries above need no lock), then re-check: the other run may have built it.
  if [ "$LOCKED" = 0 ]; then
    exec 9>"$BIN/.lock"
    if ! flock -n 9; then
      log "another build.sh is building into $BIN; waiting for it..."
      flock 9
    fi
    LOCKED=1
    if is_cached "$name" "$want"; then
      log "$name: cached ($(cut -d' ' -f2 <<<"$want"))"
      continue
    fi
  fi
  IFS='|' read -r dir pkg mod <<<"$(spec "$name")"
  log "$name: building $pkg ($(cut -d' ' -f2 <<<"$want")) with $GO_VERSION at nice $NICE"
  start=$(date +%s)
  tmp="$BIN/.$name.tmp.$$"
  rm -f "$tmp"
  # GOFLAGS is reset so that a user's GOFLAGS (e.g. -mod=mod) cannot alter the pins. -v names
  # each package as it compiles, for the heartbeat (it is no build flag: outside the stamp).
  # shellcheck disable=SC2086 # BUILD_FLAGS is a list of flags
  if ! (cd "$HERE/go/$dir" && GOFLAGS='' CGO_ENABLED=0 \
        progress -n packages "build: $name" "$(usual "$name")" \
        nice -n "$NICE" go build -v $BUILD_FLAGS -ldflags "$(ldflags_for "$name" "$(pinned_version "$dir" "$mod")")" -o "$tmp" "$pkg"); then
    rm -f "$tmp"
    die "$name: go build failed (module dir: $HERE/go/$dir)"
  fi
  mv -f "$tmp" "$BIN/$name"
  echo "$want" >"$BIN/.stamp/$name"
  built=$((built + 1))
  log "$name: built in $(( $(date +%s) - start ))s, $(du -h "$BIN/$name" | cut -f1)"
done

# Human-readable summary of everything currently cached.
: >"$BIN/.STAMP.tmp.$$"
for f in "$BIN"/.stamp/*; do [ -f "$f" ] && cat "$f" >>"$BIN/.STAMP.tmp.$$"; done
mv -f "$BIN/.STAMP.tmp.$$" "$BIN/STAMP"

if [ "$built" = 0 ]; then log "all requested binaries were cached"; else log "built $built binary(ies)"; fi
echo "$BIN"
