# Sourced by e2e/test.sh and e2e/lab.sh: installs the Debian packages the lab and the root tests
# use (nft and ip as test oracles and for the lab's CNI emulation; tc is in iproute2), and points
# cargo at the shared cache so a clean clone reuses what an earlier run built.
cache=${KUPORT_CACHE:-$HOME/.cache/kuport}
mkdir -p "$cache"
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
# A C compiler for the crates with C inside (ring, mimalloc).
command -v cc >/dev/null || need+=(gcc)
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
export CARGO_TERM_COLOR=never
