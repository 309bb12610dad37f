# Sourced by the scripts whose steps take minutes (e2e/lab.sh, e2e/test.sh,
# e2e/controlplane/build.sh): `progress LABEL USUAL CMD...` runs CMD with its stderr in a log and
# prints to stderr what it runs and how long it usually takes, then one heartbeat line every
# $KUPORT_PROGRESS_EVERY seconds (default 10: nothing is silent longer; at most one line per
# period, so CI's log stays readable) with the elapsed time and the log's last line (cargo's
# progress bar "Building [===>  ] 120/312: crate", go build -v's last package), and at the end the
# elapsed time. CMD's stdout passes through. On failure the log is printed whole (cargo's errors
# and warnings are in it), and CMD's exit status returned.
#
#   progress "compiling the lab" "about 7 min cold, seconds warm" cargo build -p kuport-lab
#
# Options before LABEL: -q: a step that succeeds within the first period prints nothing (a warm
# build). -n NOUN: each line CMD prints is one NOUN done, and the heartbeat counts them (go build
# -v prints each package it compiles: "812 packages so far, the last k8s.io/apiserver/...").
#
# The test: e2e/tests/progress.rs.

progress() {
  local quiet=0 noun=
  while :; do
    case "$1" in
      -q) quiet=1; shift ;;
      -n) noun=$2; shift 2 ;;
      *) break ;;
    esac
  done
  local label=$1 usual=$2
  shift 2
  local every=${KUPORT_PROGRESS_EVERY:-10}
  local log start beat rc=0 shell=$BASHPID header
  log=$(mktemp "${TMPDIR:-/tmp}/kuport-progress.XXXXXX")
  start=$(date +%s)
  header=$(printf '[%s] %s (usually %s)' "$label" "$*" "$usual")
  ((quiet)) || printf '%s\n' "$header" >&2
  # The heartbeat; it also ends when the calling shell is gone (interrupted). Its sleep is
  # killed with it: a sleep left behind would hold a caller's $(...) or pipe open.
  # shellcheck disable=SC2046 # jobs -p: one pid a word
  (
    # A TERM may come before or just after the sleep starts (a quick step): its own jobs.
    trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$every" &
      wait $!
      [ -e "$log" ] && kill -0 "$shell" 2>/dev/null || exit 0
      if ((quiet)); then
        printf '%s\n' "$header" >&2
        quiet=0
      fi
      # The last non-empty line; cargo separates its bar's frames with \r. The bar itself goes:
      # "Building 394/398: kuport-controller, kuport-node-exec" says how far it is.
      last=$(tail -c 4096 "$log" | tr '\r' '\n' | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/ \[[=> ]*\]//' \
        | grep -v '^$' | tail -n 1 | cut -c 1-120) || true # no output yet: grep fails (pipefail)
      if [ -n "$noun" ] && [ -n "$last" ]; then
        last="$(grep -c . "$log") $noun so far, the last $last"
      fi
      printf '[%s] %ss (usually %s): %s\n' "$label" "$(($(date +%s) - start))" "$usual" "${last:-(nothing printed yet)}" >&2
    done
  ) &
  beat=$!
  # In the foreground, so an interrupt reaches it. cargo draws its progress bar only on a
  # terminal unless told; its last frame is the heartbeat's.
  CARGO_TERM_PROGRESS_WHEN=always CARGO_TERM_PROGRESS_WIDTH=${CARGO_TERM_PROGRESS_WIDTH:-100} "$@" 2>"$log" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  if ((rc == 0)); then
    if ((!quiet || $(date +%s) - start >= every)); then
      printf '[%s] done in %ss\n' "$label" "$(($(date +%s) - start))" >&2
    fi
  else
    # Unless the heartbeat has printed it.
    ((!quiet || $(date +%s) - start >= every)) || printf '%s\n' "$header" >&2
    # The log without the bar's frames.
    tr '\r' '\n' <"$log" | grep -Ev '^ *Building \[|^ *$' >&2 || true
    printf '[%s] FAILED (exit %s) after %ss\n' "$label" "$rc" "$(($(date +%s) - start))" >&2
  fi
  rm -f "$log"
  return "$rc"
}
