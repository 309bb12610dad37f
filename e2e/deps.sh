# Sourced by e2e/test.sh and e2e/lab.sh: installs the Debian packages the lab and the root tests
# use (nft, ip and wg as test oracles and for the lab's CNI emulation, tc in iproute2,
# wireguard-go), and points cargo at the shared cache so a clean clone reuses what an earlier
# run built.
cache=${KUPORT_CACHE:-$HOME/.cache/kuport}
mkdir -p "$cache"
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
# A C compiler for the crates with C inside (ring, mimalloc).
command -v cc >/dev/null || need+=(gcc)
# WireGuard in userspace and its oracle (this kernel has no WireGuard module; docs/overlay/node.md).
command -v wireguard-go >/dev/null || need+=(wireguard-go)
command -v wg >/dev/null || need+=(wireguard-tools)
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  apt-get update -qq
  # No recommends: wireguard-tools would pull in a kernel image.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
export CARGO_TERM_COLOR=never
# No incremental cache: it is kept per checkout path, so every clean clone added gigabytes to the
# shared target folder (28 of its 73 GiB here one day); dependencies are cached either way.
export CARGO_INCREMENTAL=0
