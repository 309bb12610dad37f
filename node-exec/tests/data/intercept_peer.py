# The intercept root test's processes (node-exec/tests/intercept_root.rs): servers that answer
# with a banner naming themselves, an emulated mesh inbound proxy, and one-shot clients.
import select
import socket
import sys

mode = sys.argv[1]


def tcp_listen(port):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    s.listen(64)
    return s


def udp_socks(port):
    # Reply from the address each datagram was sent to (IP_PKTINFO = 8, IPV6_RECVPKTINFO = 49):
    # an output-hook redirect delivers to 127.0.0.1, and a reply from the pod address would miss
    # conntrack's reply tuple (docs/intercept/table.md, "UDP agents").
    out = []
    for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.setsockopt(socket.IPPROTO_IPV6, 49, 1)
        else:
            s.setsockopt(socket.IPPROTO_IP, 8, 1)
        s.bind((addr, port))
        out.append(s)
    return out


if mode == "tcp":  # PORT BANNER
    s, banner = tcp_listen(int(sys.argv[2])), (sys.argv[3] + "\n").encode()
    while True:
        c, _ = s.accept()
        c.sendall(banner)
        c.close()
elif mode == "udp":  # PORT BANNER
    socks, banner = udp_socks(int(sys.argv[2])), (sys.argv[3] + "\n").encode()
    while True:
        for s in select.select(socks, [], [])[0]:
            _, anc, _, peer = s.recvmsg(2048, 256)
            s.sendmsg([banner], [a for a in anc if a[1] in (8, 50)], 0, peer)
elif mode == "mesh-in":  # PORT APP_PORT: tags the stream, then dials the app over loopback
    s, app = tcp_listen(int(sys.argv[2])), int(sys.argv[3])
    while True:
        c, _ = s.accept()
        try:
            u = socket.create_connection(("127.0.0.1", app), timeout=3)
            data = u.recv(512)
            u.close()
        except OSError:
            data = b"ERR\n"
        c.sendall(b"MESH-IN:" + data)
        c.close()
elif mode == "tcp-get":  # HOST PORT [MARK]
    host, port = sys.argv[2], int(sys.argv[3])
    try:
        c = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        if len(sys.argv) > 4:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[4], 0))
        c.settimeout(3)
        c.connect((host, port))
        print(c.recv(512).decode().strip())
    except OSError:
        print("ERR")
elif mode == "udp-get":  # HOST PORT
    host, port = sys.argv[2], int(sys.argv[3])
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.connect((host, port))
    s.send(b"ping\n")
    try:
        print(s.recv(512).decode().strip())
    except OSError:
        print("NONE")
