#!/usr/bin/env bash
# Remove the real node made by up.sh and everything it left: every process in its cgroup tree
# (kubelet, containerd, shims, containers, relays, the namespace holder), the cgroup directories
# in every hierarchy, its network namespace, its control plane, and LAB_DIR. The node's mounts
# lived in its own mount namespace and end with its last process. Then it checks that nothing is
# left and says so; exit 1 if something is.
#
# Usage: down.sh [LAB_DIR]   (default as up.sh). KUPORT_KEEP_STATE=1 keeps LAB_DIR (logs).
# Safe to run twice or on a LAB_DIR that does not exist.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LAB="${1:-${KUPORT_REALNODE_DIR:-${TMPDIR:-/tmp}/kuport-realnode}}"
MARKER=.kuport-realnode
log() { printf '[realnode down] %s\n' "$*" >&2; }

[ -d "$LAB" ] || { log "$LAB does not exist; nothing to do"; exit 0; }
LAB="$(cd -- "$LAB" && pwd -P)"
[ -f "$LAB/$MARKER" ] || { log "ERROR: $LAB is no real-node lab (no $MARKER); refusing to touch it"; exit 1; }
ID="$(cat "$LAB/$MARKER")"
NS="krn-$ID"
CG="kuport-realnode-$ID"

# Every cgroup directory of the lab, in every hierarchy (the list up.sh wrote may be partial).
cg_roots() { awk -v cg="$CG" '$3 == "cgroup" || $3 == "cgroup2" { print $2 "/" cg }' /proc/self/mounts; }
cg_pids() {
  local r
  for r in $(cg_roots); do
    if [ -d "$r" ]; then find "$r" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
  done | sort -un
}

# The kubelet first and politely: it would otherwise restart what we kill.
if [ -f "$LAB/kubelet.pid" ]; then
  p="$(cat "$LAB/kubelet.pid")"
  if [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q kubelet; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 40); do [ -d "/proc/$p" ] || break; sleep 0.25; done
  fi
fi

# Then the whole tree: frozen (no forks while we kill), killed, thawed so that the kills land.
freezer="$(awk '$3 == "cgroup" && $4 ~ /(^|,)freezer(,|$)/ { print $2; exit }' /proc/self/mounts)"
for _ in $(seq 1 50); do
  pids="$(cg_pids)"
  [ -n "$pids" ] || break
  if [ -n "$freezer" ] && [ -d "$freezer/$CG" ]; then echo FROZEN >"$freezer/$CG/freezer.state" || true; fi
  # shellcheck disable=SC2086 # a list of pids
  kill -KILL $pids 2>/dev/null || true
  if [ -n "$freezer" ] && [ -d "$freezer/$CG" ]; then echo THAWED >"$freezer/$CG/freezer.state" || true; fi
  sleep 0.2
done
[ -z "$(cg_pids)" ] || log "processes left in $CG: $(cg_pids | tr '\n' ' ')"

# Cgroup directories, deepest first.
for r in $(cg_roots); do
  if [ -d "$r" ]; then find "$r" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
done

ip netns del "$NS" 2>/dev/null || true
# A client namespace of chart.sh, if one was left.
ip netns del "krc-$ID" 2>/dev/null || true

"$HERE/../controlplane/down.sh" "$LAB/controlplane" >/dev/null 2>&1 || true

# What is left, if anything.
left=0
for r in $(cg_roots); do
  if [ -d "$r" ]; then log "left: cgroup $r"; left=1; fi
done
if [ -e "/run/netns/$NS" ]; then log "left: netns $NS"; left=1; fi
if [ -e "/run/netns/krc-$ID" ]; then log "left: netns krc-$ID"; left=1; fi
if grep -q " $LAB/" /proc/self/mountinfo; then log "left: mounts under $LAB"; left=1; fi
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = $$ ] && continue
  if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "$LAB/"; then
    log "left: process ${p#/proc/} ($(tr '\0' ' ' <"$p/cmdline" | cut -c1-100))"; left=1
  fi
done

if [ "$left" = 0 ] && [ "${KUPORT_KEEP_STATE:-0}" != 1 ]; then
  rm -rf "$LAB"
  log "removed the node and $LAB"
elif [ "$left" = 0 ]; then
  log "removed the node; state kept in $LAB"
else
  log "something is left (above); $LAB kept"
  exit 1
fi
