# Sourced by e2e/chart/test.sh (which defines `log` first): Prometheus's promtool, to check the
# chart's alert rules. Taken from Debian's prometheus package, unpacked (not installed) into
# ${KUPORT_CACHE:-~/.cache/kuport}/prometheus once; instant when present.
prom_dir=${KUPORT_CACHE:-$HOME/.cache/kuport}/prometheus
promtool_bin=$prom_dir/usr/bin/promtool
if ! [ -x "$promtool_bin" ]; then
  log "fetching promtool (Debian's prometheus package, ~20 MB, seconds)"
  prom_tmp=$(mktemp -d "${TMPDIR:-/tmp}/kuport-prometheus.XXXXXX")
  # Quiet first try (apt warns it downloads unsandboxed as root); the lists may be missing on
  # a fresh machine, so update them once and try again.
  (cd "$prom_tmp" && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; })
  rm -rf "$prom_dir.new"
  mkdir -p "$(dirname "$prom_dir")"
  dpkg-deb -x "$prom_tmp"/prometheus_*.deb "$prom_dir.new"
  rm -rf "$prom_tmp" "$prom_dir"
  # Renamed whole, so an interrupted fetch never leaves a half-unpacked cache behind.
  mv "$prom_dir.new" "$prom_dir"
fi
[ -x "$promtool_bin" ] || { log "missing $promtool_bin"; exit 1; }
promtool() { "$promtool_bin" "$@"; }
