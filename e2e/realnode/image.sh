#!/usr/bin/env bash
# The real node's two local images, as OCI archives for `ctr images import` (no registry is
# reachable): the pod sandbox (pause.c, linked static) and a test image of Debian's
# busybox-static (httpd, nc, sh): /www's index says "kuport realnode test pod", its
# /cgi-bin/addr answers the caller's address as the pod saw it, and /agent's index says "agent"
# (an interception agent's stand-in, httpd -h /agent). Sourced by up.sh; `image.sh DIR`
# writes DIR/pause.tar and DIR/testpod.tar and prints their image names.
set -euo pipefail

PAUSE_IMAGE=kuport.local/pause:lab
TEST_IMAGE=kuport.local/testpod:lab

# oci_archive OUT NAME ROOTFS CONFIG_JSON: one uncompressed layer of ROOTFS (owned by root,
# mtimes zeroed so that equal inputs give equal digests), CONFIG_JSON as the image's "config".
oci_archive() {
  local out=$1 name=$2 rootfs=$3 config=$4 dir layer diff lsize cfg csize man msize
  dir=$(mktemp -d)
  mkdir -p "$dir/blobs/sha256"
  tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$dir/layer" .
  diff=$(sha256sum "$dir/layer" | cut -d' ' -f1)
  lsize=$(stat -c %s "$dir/layer")
  mv "$dir/layer" "$dir/blobs/sha256/$diff"
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$config" "$diff" >"$dir/config"
  cfg=$(sha256sum "$dir/config" | cut -d' ' -f1)
  csize=$(stat -c %s "$dir/config")
  mv "$dir/config" "$dir/blobs/sha256/$cfg"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg" "$csize" "$diff" "$lsize" >"$dir/manifest"
  man=$(sha256sum "$dir/manifest" | cut -d' ' -f1)
  msize=$(stat -c %s "$dir/manifest")
  mv "$dir/manifest" "$dir/blobs/sha256/$man"
  # ctr names the image after io.containerd.image.name.
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$man" "$msize" "$name" "${name##*:}" >"$dir/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
  tar -C "$dir" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$dir"
}

# build_images DIR: both archives into DIR (about a second).
build_images() {
  local out=$1 here root
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$out"
  root=$(mktemp -d)
  gcc -static -Os -s -o "$root/pause" "$here/pause.c"
  oci_archive "$out/pause.tar" "$PAUSE_IMAGE" "$root" '{"Entrypoint":["/pause"]}'
  rm -rf "$root"

  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/www/cgi-bin" "$root/agent" "$root/tmp"
  cp /bin/busybox "$root/bin/busybox"
  for a in sh httpd nc sleep cat ip hostname wget; do ln -s busybox "$root/bin/$a"; done
  echo "kuport realnode test pod" >"$root/www/index.html"
  printf '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n%%s\\n" "$REMOTE_ADDR"\n' >"$root/www/cgi-bin/addr"
  chmod 755 "$root/www/cgi-bin/addr"
  echo "agent" >"$root/agent/index.html"
  oci_archive "$out/testpod.tar" "$TEST_IMAGE" "$root" \
    '{"Env":["PATH=/bin"],"Cmd":["/bin/httpd","-f","-v","-p","8080","-h","/www"]}'
  rm -rf "$root"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  [ $# = 1 ] || { echo "usage: image.sh DIR" >&2; exit 2; }
  build_images "$1"
  echo "$PAUSE_IMAGE $1/pause.tar"
  echo "$TEST_IMAGE $1/testpod.tar"
fi
