//! The executor's own line (docs/design.md, "What the executor refuses"), against a fake
//! controller, applying into a scratch namespace: a state that names a routing table kuport
//! does not own, a sysctl it never computes or a namespace file outside `/run/netns` is refused
//! whole, with a reason naming the object; what was applied before, and the node's own routes in
//! that table, stay. `ip` and `sysctl` are the oracle.

#[path = "common/fake.rs"]
mod fake;
#[path = "common/host.rs"]
mod host;

use std::time::Duration;

use host::{root, run};
use kuport_node_exec::sync::{self, NodeKeepers};
use kuport_proto::v1::{
    Ack, ControllerMessage, DesiredState, IpRule, NetnsState, NodeState, Route, Sysctl, controller_message,
};

struct Scratch(String);

impl Scratch {
    fn new() -> Self {
        let name = format!("kbd-{}", std::process::id());
        let _ = std::process::Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name]);
        let s = Scratch(name);
        s.ip(&["link", "set", "lo", "up"]);
        s.ip(&["link", "add", "eth-u", "type", "veth", "peer", "name", "eth-u-p"]);
        s.ip(&["addr", "add", "192.0.2.2/24", "dev", "eth-u"]);
        s.ip(&["link", "set", "eth-u", "up"]);
        s.ip(&["link", "set", "eth-u-p", "up"]);
        s.ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "eth-u"]);
        // The node's own route in table 100, which no state of kuport's may take over.
        s.ip(&["route", "add", "198.51.100.0/24", "via", "192.0.2.1", "dev", "eth-u", "table", "100"]);
        s.sysctl("net.ipv4.conf.all.rp_filter=0");
        s
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.0.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn sysctl(&self, arg: &str) -> String {
        run("ip", &["netns", "exec", &self.0, "sysctl", "-n", "-w", arg])
    }

    fn read(&self, key: &str) -> String {
        run("ip", &["netns", "exec", &self.0, "sysctl", "-n", key]).trim().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn route(table: u32, dst: &str) -> Route {
    Route { table, dst: dst.into(), via: "192.0.2.1".into(), dev: "eth-u".into() }
}

/// The host entry kuport may program: a route in slot 1's table and IPv4 forwarding.
fn base() -> NetnsState {
    NetnsState {
        routes: vec![route(201, "203.0.113.0/25")].into(),
        sysctls: vec![Sysctl { key: "net.ipv4.ip_forward".into(), value: "1".into() }],
        ..Default::default()
    }
}

/// The base with one more allowed route (table 202), which a refused state must not apply.
fn grown() -> NetnsState {
    let mut ns = base();
    ns.routes.push(route(202, "203.0.113.128/25"));
    ns
}

fn message(sequence: u64, netns: Vec<NetnsState>) -> ControllerMessage {
    let mut state = NodeState { node: "n1".into(), netns };
    kuport_proto::canonicalize(&mut state);
    let version = kuport_proto::version(&state);
    ControllerMessage {
        message: Some(controller_message::Message::State(DesiredState {
            term: 1,
            sequence,
            version,
            state: Some(state),
        })),
    }
}

fn with(change: impl FnOnce(&mut NetnsState)) -> NetnsState {
    let mut ns = grown();
    change(&mut ns);
    ns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_outside_kuports_line_is_refused_whole() {
    if !root() {
        return;
    }
    let node = Scratch::new();
    let passwd = NetnsState { target: kuport_proto::netns::path("/etc/passwd"), ..Default::default() };
    let script = vec![
        message(1, vec![base()]),
        // Another table: it would become kuport's, the node's route in it deleted.
        message(2, vec![with(|ns| ns.routes.push(route(100, "10.100.0.0/16")))]),
        // main, off kuport's links.
        message(3, vec![with(|ns| ns.routes.push(route(254, "10.254.0.0/16")))]),
        message(
            4,
            vec![with(|ns| {
                ns.ip_rules.push(IpRule {
                    pref: 102,
                    fwmark: 0x6b70_0001,
                    fwmask: u32::MAX,
                    table: 100,
                    ..Default::default()
                })
            })],
        ),
        message(
            5,
            vec![with(|ns| ns.sysctls.push(Sysctl { key: "net.ipv4.conf.all.rp_filter".into(), value: "2".into() }))],
        ),
        message(6, vec![grown(), passwd]),
    ];
    let (address, mut seen) = fake::start(script).await;
    let mut cfg = sync::Config::new(format!("http://{address}"), "n1");
    cfg.netns = Some(format!("/var/run/netns/{}", node.0).into());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let keepers = NodeKeepers::new(cfg.netns.clone());
    let exec = tokio::spawn(sync::run(cfg, keepers, async {
        let _ = stopped.await;
    }));
    let acks: Vec<Ack> = fake::acks(&mut seen, 6, Duration::from_secs(30)).await;
    // Nothing of states 2 to 6 reached the kernel; state 1 and the node's own routes stay.
    let slot1 = node.ip(&["route", "show", "table", "201"]);
    let all = node.ip(&["route", "show", "table", "all"]);
    let table100 = node.ip(&["route", "show", "table", "100"]);
    let main = node.ip(&["route", "show", "table", "main"]);
    let rules = node.ip(&["rule", "show"]);
    let (rp_filter, forwarding) = (node.read("net.ipv4.conf.all.rp_filter"), node.read("net.ipv4.ip_forward"));
    let _ = stop.send(());
    let _ = exec.await;

    let summary: Vec<(u64, bool)> = acks.iter().map(|a| (a.sequence, a.ok)).collect();
    assert_eq!(summary, [(1, true), (2, false), (3, false), (4, false), (5, false), (6, false)], "{acks:#?}");
    let named = |i: usize, object: &str, reason: &str| {
        let e = &acks[i].errors;
        assert!(e.len() == 1 && e[0].object.contains(object) && e[0].reason.contains(reason), "state {}: {e:?}", i + 1);
    };
    named(1, "route 10.100.0.0/16 via 192.0.2.1 dev eth-u table 100", "table 100 is not kuport's");
    named(2, "route 10.254.0.0/16 via 192.0.2.1 dev eth-u table 254", "table 254 is not kuport's");
    named(3, "rule pref 102 fwmark 0x6b700001 lookup 100", "table 100 is not kuport's");
    named(4, "sysctl net.ipv4.conf.all.rp_filter", "kuport sets only net.ipv4.ip_forward");
    named(5, "network namespace \"/etc/passwd\"", "only a name directly under /run/netns/");
    assert!(slot1.contains("203.0.113.0/25 via 192.0.2.1 dev eth-u"), "state 1 kept: {slot1}");
    assert!(!all.contains("203.0.113.128/25") && !all.contains("table 202"), "no refused state's route: {all}");
    assert!(table100.contains("198.51.100.0/24 via 192.0.2.1") && !table100.contains("10.100."), "{table100}");
    assert!(main.contains("default via 192.0.2.1") && !main.contains("10.254."), "{main}");
    assert!(!rules.contains("lookup 100"), "{rules}");
    assert_eq!((rp_filter.as_str(), forwarding.as_str()), ("0", "1"));
}
