#!/usr/bin/env bash
# The executor's kernel WireGuard backend against the real wireguard.ko (docs/overlay/node.md,
# "Proven in a real kernel"). This host's kernel has no WireGuard, so Debian's kernel
# (linux-image-amd64, downloaded and unpacked, never installed) boots under QEMU with software
# emulation (TCG: KVM does not work here) from an initramfs holding busybox, the kernel's
# modules, ip, wg and node-exec's WireGuard root tests. In the guest, as root:
#   - tests/wireguard_root, which must pass on the kernel backend (KUPORT_WIREGUARD=kernel);
#   - the same tests built with the feature `wireguard-ablation` (the peer endpoint's port
#     encoded in host byte order), which must fail: the VM test is the oracle.
# Each binary's output and exit status come back on the serial console; this script exits
# nonzero on a failure, a missing result or a timeout. Run as root: bash e2e/vm/wireguard.sh
# (the guest's console stays in $cache/vm/serial.log).
# Cached in ${KUPORT_CACHE:-~/.cache/kuport}/vm: the kernel per version, the initramfs per
# hash of its inputs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. e2e/deps.sh
vm=$cache/vm
mkdir -p "$vm"
TIMEOUT=${KUPORT_VM_TIMEOUT:-600}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "vm: $*"; }

# --- host packages ----------------------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- the kernel, per version ------------------------------------------------------------------
t=$(now)
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !n++ { print $2 }')
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ && !n++ { print $2 }')
fi
kver=${pkg#linux-image-}
kdir=$vm/kernel-$kver
if [ ! -s "$kdir/vmlinux" ]; then
  say "downloading and unpacking $pkg"
  rm -rf "$kdir" "$kdir.tmp" "$vm/deb" && mkdir -p "$vm/deb" "$kdir.tmp"
  (cd "$vm/deb" && apt-get download "$pkg" >/dev/null 2>&1)
  dpkg-deb -x "$vm/deb/${pkg}"_*.deb "$kdir.tmp"
  rm -rf "$vm/deb"
  [ -f "$kdir.tmp/lib/modules/$kver/modules.dep" ] || busybox depmod -b "$kdir.tmp" "$kver"
  # QEMU boots the uncompressed ELF through its PVH entry: no firmware, no real mode and no
  # decompression, the slow parts under TCG. bzImage carries it xz-compressed after its stub.
  at=$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$kdir.tmp/boot/vmlinuz-$kver" | cut -d: -f1)
  tail -c +$((at + 1)) "$kdir.tmp/boot/vmlinuz-$kver" >"$kdir.tmp/vmlinux.xz"
  xz -dc --single-stream "$kdir.tmp/vmlinux.xz" >"$kdir.tmp/vmlinux"
  rm "$kdir.tmp/vmlinux.xz"
  mv "$kdir.tmp" "$kdir"
  # Earlier versions go.
  find "$vm" -maxdepth 1 -name 'kernel-*' ! -name "kernel-$kver" -exec rm -rf {} +
fi
say "kernel $kver ready in $(since "$t")s"

# --- the test binaries ------------------------------------------------------------------------
t=$(now)
# `--workspace` as e2e/test.sh builds, so that the dependencies are the ones it compiled.
build=(cargo test --locked --workspace --test wireguard_root --no-run)
ablation=(--features kuport-node-exec/wireguard-ablation)
nice -n 10 "${build[@]}"
nice -n 10 "${build[@]}" "${ablation[@]}"
# The path of the test binary cargo built.
test_binary() {
  "${build[@]}" "$@" --message-format=json 2>/dev/null |
    grep '"name":"wireguard_root"' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1
}
tests=$(test_binary) || true
ablated=$(test_binary "${ablation[@]}") || true
[ -x "$tests" ] && [ -x "$ablated" ] && [ "$tests" != "$ablated" ] || { say "no test binaries ($tests, $ablated)"; exit 1; }
say "test binaries ready in $(since "$t")s"

# --- the initramfs, per hash of its inputs ----------------------------------------------------
t=$(now)
tools=(/bin/busybox "$(command -v ip)" "$(command -v wg)")
# (this script too: it chooses what goes in)
key=$( (echo "$kver"; cat e2e/vm/init.sh e2e/vm/wireguard.sh; sha256sum "${tools[@]}" "$tests" "$ablated" | cut -d' ' -f1) | sha256sum | cut -c1-16)
image=$vm/initramfs-$key.img
if [ ! -s "$image" ]; then
  say "building the initramfs"
  root=$vm/root
  rm -rf "$root"
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,etc,tests} "$root/lib/modules/$kver"
  mkdir -p "$root/var" && ln -s ../run "$root/var/run"
  cp /bin/busybox "$root/bin/"
  ln -s busybox "$root/bin/sh"
  cp -L "$(command -v ip)" "$root/usr/sbin/ip"
  cp -L "$(command -v wg)" "$root/usr/bin/wg"
  # Debug info stripped: the binaries are unpacked into the guest's memory.
  strip --strip-debug -o "$root/tests/wireguard_root" "$tests"
  strip --strip-debug -o "$root/tests/wireguard_root-ablated" "$ablated"
  for lib in $(ldd "$root"/usr/sbin/ip "$root"/usr/bin/wg "$root"/tests/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 } /^\t\// { print $1 }' | sort -u); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  # wireguard, veth and nf_tables (the executor lists the tables it owns) with what they depend
  # on, and crc32c_generic, which libcrc32c (nf_tables's) asks the crypto API for at load.
  md=$kdir/lib/modules/$kver
  for ko in $(awk -F': *' '$1 ~ /\/(wireguard|veth|nf_tables|crc32c_generic)\.ko/ { print $1; print $2 }' "$md/modules.dep" | tr ' ' '\n' | sort -u); do
    mkdir -p "$root/lib/modules/$kver/$(dirname "$ko")"
    cp "$md/$ko" "$root/lib/modules/$kver/$ko"
  done
  cp "$md/modules.builtin" "$md/modules.order" "$root/lib/modules/$kver/"
  busybox depmod -b "$root" "$kver"
  cp e2e/vm/init.sh "$root/init"
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$image.tmp"
  mv "$image.tmp" "$image"
  rm -rf "$root"
  find "$vm" -maxdepth 1 -name 'initramfs-*.img' ! -name "initramfs-$key.img" -delete
fi
say "initramfs ready in $(since "$t")s ($(du -h "$image" | cut -f1))"

# --- the boot ---------------------------------------------------------------------------------
t=$(now)
log=$vm/serial.log
rm -f "$log"
say "booting (TCG, up to ${TIMEOUT}s)"
rc=0
nice -n 10 timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1536 -machine pc \
  -nodefaults -no-user-config -display none -monitor none -no-reboot -serial "file:$log" \
  -kernel "$kdir/vmlinux" -initrd "$image" \
  -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" || rc=$?
say "the guest ran $(since "$t")s (qemu exit $rc)"

# --- the verdict ------------------------------------------------------------------------------
failed=0
fail() { say "FAILED: $*"; failed=1; }
((rc == 0)) || fail "qemu exited $rc (124: timeout after ${TIMEOUT}s)"
grep -q '^@@ wireguard loaded' "$log" || fail "the guest did not load wireguard.ko"
grep -q '^@@ end wireguard_root rc=0' "$log" || fail "tests/wireguard_root on the kernel backend"
# The ablation fails, and where the broken endpoint shows: the mesh never carries traffic.
grep -q '^@@ end wireguard_root-ablated rc=[1-9]' "$log" || fail "the ablated build passed: the VM test would not see a broken encoding"
# (grep -c reads to the end: grep -q would stop sed with SIGPIPE, a failure under pipefail.)
(($(sed -n '/^@@ begin wireguard_root-ablated/,/^@@ end/p' "$log" | grep -c 'does not reach'))) ||
  fail "the ablated mesh test did not fail for want of traffic"
grep -q '^@@ done' "$log" || fail "the guest did not finish"
# The whole console on a failure; else the markers, each test's verdict and what it skipped.
if ((failed)); then
  tr -d '\r' <"$log" | sed 's/^/guest: /'
else
  tr -d '\r' <"$log" | grep -E '^(@@ |test .* \.\.\. |test result|skipped|backend:|this kernel)' | sed 's/^/guest: /'
  say "passed: the kernel WireGuard backend against wireguard.ko; the ablation fails as it must"
fi
exit $failed
