# The overlay root test's processes (node-exec/tests/overlay_root.rs): an echo server in a pod
# that answers every UDP datagram and TCP stream with the peer address it saw and the bytes it
# got, a client that prints those answers, and a DF sender that reports what became of a
# datagram of a given size (echoed whole, refused locally, or an ICMP error). For the MSS clamp:
# a sink that reports the MSS option of the SYN it is sent (seen on the wire) and how many bytes
# arrived within a time box, and a sender of a given number of bytes.
import select
import socket
import struct
import sys
import threading
import time

mode = sys.argv[1]
IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_RECVERR = 10, 2, 11
MSG_ERRQUEUE = 0x2000


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def serve_tcp(s):
    while True:
        c, peer = s.accept()
        total = 0
        while True:
            b = c.recv(65536)
            if not b:
                break
            total += len(b)
        c.sendall(("%s %d" % (peer[0].removeprefix("::ffff:"), total)).encode())
        c.close()


def serve(port):
    t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    t.bind(("::", port))
    t.listen(16)
    threading.Thread(target=serve_tcp, args=(t,), daemon=True).start()
    udp = []
    for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        u = socket.socket(fam, socket.SOCK_DGRAM)
        if fam == socket.AF_INET6:
            u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        u.bind((addr, port))
        udp.append(u)
    print("ready", flush=True)
    while True:
        r, _, _ = select.select(udp, [], [])
        for u in r:
            b, peer = u.recvfrom(65536)
            u.sendto(("%s %d" % (peer[0], len(b))).encode(), peer)


def client(host, port, tcp_bytes):
    fam = family(host)
    u = socket.socket(fam, socket.SOCK_DGRAM)
    u.settimeout(1.0)
    answer = None
    for _ in range(3):
        u.sendto(b"kuport", (host, port))
        try:
            answer = u.recv(256).decode()
            break
        except socket.timeout:
            pass
    print("udp %s" % answer)
    t = socket.create_connection((host, port), timeout=5)
    t.sendall(b"k" * tcp_bytes)
    t.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = t.recv(256)
        if not b:
            break
        got += b
    print("tcp %s" % got.decode())


def df(host, port, size):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    u.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    u.connect((host, port))
    for _ in range(3):
        try:
            u.send(b"m" * size)
        except OSError as e:
            print("send-error %d" % e.errno)
            return
        r, _, x = select.select([u], [], [u], 1.0)
        if not r and not x:
            continue
        try:
            print("echo %s" % u.recv(256).decode())
            return
        except OSError as e:
            # The ICMP error is queued: sock_extended_err and the offender's address.
            _, anc, _, _ = u.recvmsg(512, 512, MSG_ERRQUEUE)
            for level, kind, data in anc:
                if level == socket.IPPROTO_IP and kind == IP_RECVERR:
                    errno, origin, typ, code, _pad, info, _data = struct.unpack("=IBBBBII", data[:16])
                    offender = socket.inet_ntoa(data[20:24])
                    print("icmp errno %d origin %d type %d code %d mtu %d from %s" % (
                        e.errno, origin, typ, code, info, offender))
                    return
            print("error %d" % e.errno)
            return
    print("lost")


def syn_mss(port, found):
    # Every IPv4 packet the pod's eth0 receives; the first SYN (without ACK) to `port` gives
    # its MSS option, as it arrived after every node on the way.
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
    s.bind(("eth0", 0))
    while True:
        b = s.recv(65536)
        ihl = (b[0] & 0x0F) * 4
        if b[9] != 6 or len(b) < ihl + 20:
            continue
        tcp = b[ihl:]
        dport = struct.unpack("!H", tcp[2:4])[0]
        if dport != port or tcp[13] & 0x12 != 0x02:
            continue
        doff = (tcp[12] >> 4) * 4
        opts, i = tcp[20:doff], 0
        while i < len(opts):
            kind = opts[i]
            if kind == 0:
                break
            if kind == 1:
                i += 1
                continue
            if kind == 2 and opts[i + 1] == 4:
                found.append(struct.unpack("!H", opts[i + 2:i + 4])[0])
                return
            i += max(opts[i + 1], 2)
        found.append(0)
        return


def sink(port, seconds):
    found = []
    threading.Thread(target=syn_mss, args=(port, found), daemon=True).start()
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", port))
    t.listen(1)
    print("ready", flush=True)
    c, _ = t.accept()
    deadline = time.monotonic() + seconds
    total, end = 0, "timeout"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([c], [], [], left)
        if not r:
            break
        b = c.recv(65536)
        if not b:
            end = "eof"
            break
        total += len(b)
    for _ in range(20):
        if found:
            break
        time.sleep(0.05)
    print("mss %d bytes %d %s" % (found[0] if found else -1, total, end), flush=True)
    c.close()


def send(host, port, n):
    # The test ends the sender once the sink has reported.
    t = socket.create_connection((host, port), timeout=5)
    t.settimeout(60)
    t.sendall(b"k" * n)
    t.shutdown(socket.SHUT_WR)
    # Until the sink has had its time and closes.
    try:
        t.recv(1)
    except OSError:
        pass
    print("sent %d" % n)


if mode == "serve":
    serve(int(sys.argv[2]))
elif mode == "client":
    client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif mode == "df":
    df(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif mode == "sink":
    sink(int(sys.argv[2]), float(sys.argv[3]))
elif mode == "send":
    send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
