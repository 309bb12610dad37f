# The overlay root test's processes (node-exec/tests/overlay_root.rs): an echo server in a pod
# that answers every UDP datagram and TCP stream with the peer address it saw and the bytes it
# got, a client that prints those answers, and a DF sender that reports what became of a
# datagram of a given size (echoed whole, refused locally, or an ICMP error).
import select
import socket
import struct
import sys
import threading

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


if mode == "serve":
    serve(int(sys.argv[2]))
elif mode == "client":
    client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif mode == "df":
    df(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
