#!/bin/sh
# The guest's /init (e2e/vm/wireguard.sh): mounts what the tests need, loads wireguard.ko, runs
# each test binary as root and prints its output between "@@ begin NAME" and "@@ end NAME rc=N"
# on the console, then powers off.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
ip link set lo up
echo "@@ boot $(cut -d' ' -f1 /proc/uptime)s $(uname -r)"
modprobe wireguard && modprobe veth && modprobe crc32c_generic && modprobe nf_tables && echo "@@ wireguard loaded"
# The tests assert that the executor picked the kernel backend (node-exec/tests/wireguard_root.rs).
export KUPORT_WIREGUARD=kernel RUST_BACKTRACE=1
# The ablated build runs the mesh test alone: it fails after its 10 s wait for traffic.
run() {
  echo "@@ begin $1 $(cut -d' ' -f1 /proc/uptime)s"
  "/tests/$1" --test-threads=2 --show-output $2 2>&1
  rc=$?
  echo "@@ end $1 rc=$rc $(cut -d' ' -f1 /proc/uptime)s"
}
run wireguard_root
run wireguard_root-ablated a_mesh_of_three
echo "@@ done"
poweroff -f
