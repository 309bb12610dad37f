#!/usr/bin/env bash
# Stop the control plane started by up.sh and remove its state dir.
#
# Usage: down.sh [STATE_DIR]
#   STATE_DIR defaults to $KUPORT_STATE_DIR or ${TMPDIR:-/tmp}/kuport-controlplane.
#   Set KUPORT_KEEP_STATE=1 to stop the processes but keep the dir (logs, certs).
# Only processes recorded in STATE_DIR/*.pid whose command line still is the
# binary that up.sh started are signalled (TERM, then KILL after 20s).
# Safe to run twice, or on a dir that does not exist.
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "usage: $(basename "$0") [STATE_DIR]   (see --help)" >&2; exit 2 ;;
esac

STATE="${1:-${KUPORT_STATE_DIR:-${TMPDIR:-/tmp}/kuport-controlplane}}"
MARKER=".kuport-controlplane"

log() { printf '[down] %s\n' "$*" >&2; }

if [ ! -d "$STATE" ]; then
  log "$STATE does not exist; nothing to do"
  exit 0
fi
STATE="$(cd -- "$STATE" && pwd)"
if [ ! -f "$STATE/$MARKER" ]; then
  log "ERROR: $STATE is not a kuport control-plane state dir (no $MARKER); refusing to touch it"
  exit 1
fi

stop() { # name
  local f="$STATE/$1.pid" p
  [ -f "$f" ] || return 0
  p="$(cat "$f")"
  if [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- "/$1 "; then
    log "stopping $1 (pid $p)"
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 80); do
      [ -d "/proc/$p" ] || break
      # a zombie child of ours counts as gone
      [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && break
      sleep 0.25
    done
    if [ -d "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
      log "$1 (pid $p) did not stop after 20s; sending KILL"
      kill -KILL "$p" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

# apiserver first, so it does not spin on a vanished etcd
stop kube-apiserver
stop etcd

if [ "${KUPORT_KEEP_STATE:-0}" = 1 ]; then
  log "stopped; state kept in $STATE"
else
  rm -rf "$STATE"
  log "stopped and removed $STATE"
fi
