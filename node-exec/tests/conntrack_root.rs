//! Root tests of conntrack cleanup: client -- router (DNAT) -- server in scratch network
//! namespaces, with the router's /proc/net/nf_conntrack as the oracle. They fail when not run as
//! root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use kuport_node_exec::conntrack::{ConntrackError, StaleFlows, StalePath, delete_stale};
use kuport_node_exec::executor::Executor;
use kuport_node_exec::sys::netns;
use kuport_proto::build::{addr, base_chain, element, ifname, lookup, nat_to_selector, port, proto, rule, set, table};
use kuport_proto::v1::{
    ChainPolicy, ChainType, Hook, L4Proto, NatKind, NetnsState, NftFamily, NftSet, NftType, Selector, UdpFlows,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 231, 1, 2);
const ROUTER_FRONT: Ipv4Addr = Ipv4Addr::new(10, 231, 1, 1);
const ROUTER_BACK: Ipv4Addr = Ipv4Addr::new(10, 231, 2, 1);
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 231, 2, 2);
/// Not on the wire: the "new" DNAT target the stale flow should have moved to.
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 231, 2, 3);
const PORT: u16 = 27015;
/// A second published port: its entry must survive deletes aimed at PORT.
const OTHER_PORT: u16 = 27016;
const UDP: u8 = 17;

/// client -- router -- server, deleted on drop (after the server thread stopped).
struct Lab {
    names: [String; 3],
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Lab {
    fn new() -> Self {
        // Tests run at once in one process: each lab its own names.
        static LABS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let lab = LABS.fetch_add(1, Ordering::Relaxed);
        let names = ["cl", "rt", "sv"].map(|n| format!("kuport-ct-{n}-{}-{lab}", std::process::id()));
        let mut lab = Lab { names, stop: Arc::new(AtomicBool::new(false)), server: None };
        for n in &lab.names {
            run("ip", &["netns", "add", n]);
        }
        let [c, r, s] = lab.names.clone();
        run("ip", &["link", "add", "c0", "netns", &c, "type", "veth", "peer", "name", "r0", "netns", &r]);
        run("ip", &["link", "add", "s0", "netns", &s, "type", "veth", "peer", "name", "r1", "netns", &r]);
        lab.ip(&c, &["addr", "add", &format!("{CLIENT}/24"), "dev", "c0"]);
        lab.ip(&r, &["addr", "add", &format!("{ROUTER_FRONT}/24"), "dev", "r0"]);
        lab.ip(&r, &["addr", "add", &format!("{ROUTER_BACK}/24"), "dev", "r1"]);
        lab.ip(&s, &["addr", "add", &format!("{SERVER}/24"), "dev", "s0"]);
        for (ns, dev) in [(&c, "c0"), (&r, "r0"), (&r, "r1"), (&s, "s0")] {
            lab.ip(ns, &["link", "set", dev, "up"]);
        }
        lab.ip(&c, &["route", "add", "default", "via", &ROUTER_FRONT.to_string()]);
        lab.ip(&s, &["route", "add", "default", "via", &ROUTER_BACK.to_string()]);
        lab.exec(&r, &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);

        lab.router_rules(&format!(
            "table ip kpct {{\n  chain pre {{\n    type nat hook prerouting priority dstnat;\n    \
             meta l4proto {{ tcp, udp }} th dport {{ {PORT}, {OTHER_PORT} }} dnat to {SERVER}\n  }}\n}}\n"
        ));

        lab.server = Some(lab.start_server());
        lab
    }

    fn path(&self, i: usize) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.names[i])
    }
    fn client(&self) -> PathBuf {
        self.path(0)
    }
    fn router(&self) -> PathBuf {
        self.path(1)
    }

    fn exec(&self, ns: &str, cmd: &[&str]) -> String {
        let mut a = vec!["netns", "exec", ns];
        a.extend_from_slice(cmd);
        run("ip", &a)
    }
    fn ip(&self, ns: &str, args: &[&str]) {
        let mut a = vec!["-n", ns];
        a.extend_from_slice(args);
        run("ip", &a);
    }

    /// Loads `ruleset` into the router with `nft -f`.
    fn router_rules(&self, ruleset: &str) {
        let file = std::env::temp_dir().join(format!("{}.nft", self.names[1]));
        std::fs::write(&file, ruleset).unwrap();
        let loaded =
            Command::new("ip").args(["netns", "exec", &self.names[1], "nft", "-f"]).arg(&file).output().unwrap();
        let _ = std::fs::remove_file(&file);
        assert!(loaded.status.success(), "nft -f: {}", String::from_utf8_lossy(&loaded.stderr));
    }

    /// UDP echo on both ports and a TCP listener on PORT, in the server namespace.
    fn start_server(&self) -> JoinHandle<()> {
        let (udp, tcp) = in_netns(&self.path(2), || {
            let udp: Vec<UdpSocket> =
                [PORT, OTHER_PORT].iter().map(|p| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, *p)).unwrap()).collect();
            // Handshakes complete in the backlog; nothing needs to accept.
            let tcp = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)).unwrap();
            (udp, tcp)
        });
        let stop = self.stop.clone();
        std::thread::spawn(move || {
            let _tcp = tcp;
            for s in &udp {
                s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            }
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                for s in &udp {
                    match s.recv_from(&mut buf) {
                        // The client's address as the server saw it.
                        Ok((_, from)) => {
                            let _ = s.send_to(from.ip().to_string().as_bytes(), from);
                        }
                        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(e) => panic!("server: {e}"),
                    }
                }
            }
        })
    }

    /// The router's conntrack lines holding every one of `tokens` as a whole word.
    fn conntrack(&self, tokens: &[&str]) -> Vec<String> {
        self.exec(&self.names[1], &["cat", "/proc/net/nf_conntrack"])
            .lines()
            .filter(|l| tokens.iter().all(|t| l.split_whitespace().any(|w| w == *t)))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Runs `f` on a thread inside the namespace at `path`; sockets it makes stay in that namespace.
fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> T {
    netns::run(Some(path), || Ok::<_, kuport_node_exec::sys::Error>(f())).expect("in the namespace")
}

/// Sends one datagram to the router's published `port` and waits for the answer: the client's
/// address as the server saw it.
fn echo(sock: &UdpSocket, port: u16) -> String {
    let to = SocketAddr::from((ROUTER_FRONT, port));
    let mut buf = [0u8; 64];
    for _ in 0..50 {
        sock.send_to(b"ping", to).unwrap();
        match sock.recv_from(&mut buf) {
            Ok((n, from)) if from == to => return String::from_utf8_lossy(&buf[..n]).into_owned(),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("client: {e}"),
        }
    }
    panic!("no echo from {to}");
}

fn udp(ports: std::ops::RangeInclusive<u16>, old_target: Ipv4Addr) -> StaleFlows {
    StaleFlows { protocol: UDP, ports, path: StalePath::TranslatedTo(old_target) }
}

#[test]
fn stale_udp_flows_are_deleted_and_current_ones_kept() {
    if !root() {
        return;
    }
    let lab = Lab::new();
    let (sock, _tcp) = in_netns(&lab.client(), || {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let tcp = TcpStream::connect_timeout(&SocketAddr::from((ROUTER_FRONT, PORT)), Duration::from_secs(5)).unwrap();
        (sock, tcp)
    });
    echo(&sock, PORT);
    echo(&sock, OTHER_PORT);
    let sport = format!("sport={}", sock.local_addr().unwrap().port());
    let server_src = format!("src={SERVER}");
    let flow = |port: u16, proto: &str| {
        lab.conntrack(&[proto, &format!("dst={ROUTER_FRONT}"), &format!("dport={port}"), &server_src])
    };
    assert_eq!(lab.conntrack(&["udp", &sport, &format!("dport={PORT}"), &server_src]).len(), 1);
    assert_eq!(flow(OTHER_PORT, "udp").len(), 1);
    assert_eq!(flow(PORT, "tcp").len(), 1, "{:?}", lab.conntrack(&["tcp"]));

    // 1. Flows translated to another target: untouched.
    let n = delete_stale(Some(&lab.router()), &[udp(PORT..=OTHER_PORT, OTHER)]).expect("delete (other target)");
    assert_eq!(n, 0);
    assert_eq!(flow(PORT, "udp").len(), 1);

    // 2. Ports that do not include the flow's: nothing.
    let n = delete_stale(Some(&lab.router()), &[udp(27000..=PORT - 1, SERVER), udp(OTHER_PORT + 1..=u16::MAX, SERVER)])
        .expect("delete (other ports)");
    assert_eq!(n, 0);
    assert_eq!(flow(PORT, "udp").len(), 1);

    // 3. PORT's element moved away from SERVER: its UDP flow goes; the other port's and TCP's stay.
    let n = delete_stale(Some(&lab.router()), &[udp(PORT..=PORT, SERVER)]).expect("delete (moved target)");
    assert_eq!(n, 1);
    assert!(flow(PORT, "udp").is_empty(), "{:?}", flow(PORT, "udp"));
    assert_eq!(flow(OTHER_PORT, "udp").len(), 1);
    assert_eq!(flow(PORT, "tcp").len(), 1);
    println!("deleted the stale UDP flow; other-port UDP and TCP entries kept");

    // The next datagram makes a fresh entry through the NAT rules.
    echo(&sock, PORT);
    assert_eq!(flow(PORT, "udp").len(), 1);

    // Nothing left to delete the second time; several flows at once count every deletion.
    let all = [
        udp(PORT..=OTHER_PORT, SERVER),
        StaleFlows { protocol: 6, ports: PORT..=PORT, path: StalePath::TranslatedTo(SERVER) },
    ];
    assert_eq!(delete_stale(Some(&lab.router()), &all).expect("delete (all)"), 3);
    assert!(lab.conntrack(&[&format!("dst={ROUTER_FRONT}")]).is_empty());
    assert_eq!(delete_stale(Some(&lab.router()), &all).expect("delete (none left)"), 0);
}

#[test]
fn a_missing_namespace_is_an_open_error() {
    let flows = [udp(PORT..=PORT, SERVER)];
    let err = delete_stale(Some(Path::new("/var/run/netns/kuport-ct-absent")), &flows).unwrap_err();
    assert!(matches!(err, ConntrackError::OpenNetns { .. }), "{err}");
    println!("{err}");
}

/// The router's state: kuport's request claim for the server's UDP PORT behind r1, or no table.
fn claim_state(claimed: bool, flows: UdpFlows) -> NetnsState {
    if !claimed {
        return NetnsState::default();
    }
    let key = [NftType::Ifname, NftType::Ipv4Addr, NftType::InetProto, NftType::InetService];
    let claim = element(vec![ifname("r1"), addr(SERVER), proto(L4Proto::Udp), port(PORT.into())], vec![]);
    let set = NftSet { udp_flows: flows as i32, ..set("claim_port", &key, &[], vec![claim]) };
    let lookup = lookup(&[Selector::Oifname, Selector::IpDaddr, Selector::L4proto, Selector::ThDport], "claim_port");
    let post = base_chain(
        "kup-post",
        ChainType::Nat,
        Hook::Postrouting,
        90,
        ChainPolicy::Accept,
        vec![rule(vec![lookup], vec![nat_to_selector(NatKind::Snat, NftFamily::Ip, Selector::IpSaddr)])],
    );
    NetnsState { nft_tables: vec![table(NftFamily::Ip, "kuport", vec![set], vec![post])].into(), ..Default::default() }
}

/// A request claim that lands after the rest of its mapping (the pod's node reported the pod's
/// route late): meanwhile the CNI's masquerade rewrote the client's address, and an established
/// UDP flow keeps that entry for as long as it sends. When the claim comes, the executor deletes
/// the masqueraded entries; the flow's next datagram reaches the server with the client's own
/// address. The ablation runs first: the same claim not flagged for UDP flows leaves the flow
/// masqueraded.
#[test]
fn a_claim_that_comes_late_frees_the_masqueraded_udp_flow() {
    if !root() {
        return;
    }
    let lab = Lab::new();
    lab.router_rules(
        "table ip cni {\n  chain post {\n    type nat hook postrouting priority srcnat;\n    \
         oifname \"r1\" masquerade\n  }\n}\n",
    );
    let mut ex = Executor::new(Some(lab.router()));
    let apply = |ex: &mut Executor, claimed: bool, flows: UdpFlows| {
        ex.apply(&claim_state(claimed, flows)).unwrap_or_else(|e| panic!("apply: {e}"))
    };
    let socket = || {
        in_netns(&lab.client(), || {
            let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            sock
        })
    };
    let (client, masqueraded) = (CLIENT.to_string(), ROUTER_BACK.to_string());

    apply(&mut ex, false, UdpFlows::Claim);
    let established = socket();
    assert_eq!(echo(&established, PORT), masqueraded, "no claim: the CNI's masquerade");

    // Ablation: the claim comes, not flagged. New flows keep the client's address; the
    // established one stays masqueraded.
    apply(&mut ex, true, UdpFlows::Kept);
    let fresh = socket();
    assert_eq!(echo(&fresh, PORT), client, "a new flow is claimed");
    for _ in 0..3 {
        assert_eq!(echo(&established, PORT), masqueraded, "unflagged, the entry keeps the masquerade");
    }

    // The claim goes (its flows keep their entries), then comes flagged: the masqueraded entry
    // goes, the claimed one stays.
    apply(&mut ex, false, UdpFlows::Claim);
    assert_eq!(echo(&established, PORT), masqueraded);
    assert_eq!(echo(&fresh, PORT), client, "a claim that goes leaves its flows claimed");
    let report = apply(&mut ex, true, UdpFlows::Claim);
    let actions = report.actions.join("\n");
    assert!(actions.contains("delete 1 conntrack entries of UDP flows on a stale path"), "{actions}");
    assert_eq!(echo(&established, PORT), client, "the established flow now keeps the client's address");
    assert_eq!(echo(&fresh, PORT), client);
    println!("{actions}");
}
