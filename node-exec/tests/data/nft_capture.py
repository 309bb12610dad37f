#!/usr/bin/env python3
"""Captures what nft sends for a ruleset file, in the form the codec's byte tests read
(node-exec/src/netfilter/nft/testdata_*.txt): one nf_tables message a line, its NFT_MSG type
and its attributes (after the netlink and nfgenmsg headers) in hex. Batch begin/end are left out.

Run as root: nft_capture.py FILE.nft > testdata.txt. It loads FILE into a scratch network
namespace under `strace -e write=` and decodes the dump of the batch nft sends."""
import re
import subprocess
import sys
import tempfile

path = sys.argv[1]
ns = "kuport-capture"
subprocess.run(["ip", "netns", "add", ns], check=True)
try:
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(
            ["ip", "netns", "exec", ns, "strace", "-f", "-e", "trace=sendmsg", "-e", "write=3",
             "-o", out.name, "nft", "-f", path],
            check=True,
        )
        text = out.read()
finally:
    subprocess.run(["ip", "netns", "del", ns], check=True)

# Every sendmsg's buffers, concatenated; the batch is the one with BATCH_BEGIN (0x10).
calls, cur = [], None
for line in text.splitlines():
    if "sendmsg(" in line:
        cur = bytearray()
        calls.append(cur)
    m = re.match(r"\s*\| [0-9a-f]{5}  ((?:[0-9a-f]{2} ){1,8} ?(?:[0-9a-f]{2} ){0,8})", line)
    if m and cur is not None:
        cur.extend(bytes.fromhex(m.group(1).replace(" ", "")))

print(f"# nft {subprocess.run(['nft', '--version'], capture_output=True, text=True).stdout.split()[1]} "
      f"-f {path.split('node-exec/')[-1]}, captured with tests/data/nft_capture.py "
      "(strace -e write): one message per line, NFT_MSG type and attributes in hex")
for buf in calls:
    i = 0
    while i + 16 <= len(buf):
        length = int.from_bytes(buf[i:i + 4], "little")
        ty = int.from_bytes(buf[i + 4:i + 6], "little")
        if ty not in (0x10, 0x11):
            print(ty & 0xFF, buf[i + 20:i + length].hex())
        i += (length + 3) & ~3
