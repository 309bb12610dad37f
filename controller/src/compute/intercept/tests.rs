//! Golden texts of the interception tables (docs/intercept/table.md) and the refusals; the root
//! test node-exec/tests/intercept_root.rs proves the same tables with real connections.

use super::*;

fn tcp(container_port: u32, agent_port: u32) -> Intercept {
    Intercept { protocol: Protocol::Tcp, container_port, agent_port, proxy_port: None }
}

fn udp(container_port: u32, agent_port: u32) -> Intercept {
    Intercept { protocol: Protocol::Udp, container_port, agent_port, proxy_port: None }
}

fn spec(intercepts: Vec<Intercept>, pod: &[&str]) -> InterceptSpec {
    InterceptSpec {
        intercepts,
        identity: AgentIdentity::default(),
        mesh_dial_subnets: vec!["240.240.0.0/16".parse().unwrap(), "2001:2::/48".parse().unwrap()],
        pod_addresses: pod.iter().map(|a| a.parse().unwrap()).collect(),
    }
}

fn text(spec: &InterceptSpec) -> String {
    let c = tables(spec).expect("tables");
    let mut out: String = c.tables.iter().map(kuport_proto::text::nft_table).collect();
    for r in &c.refusals {
        out.push_str(&format!("# refused: {r}\n"));
    }
    out
}

const POD4: &str = "10.244.7.10";
const POD6: &str = "fd00:244:7::10";

#[test]
fn tcp_only() {
    insta::assert_snapshot!(text(&spec(vec![tcp(8080, 9080)], &[POD4])));
}

#[test]
fn tcp_and_udp_on_one_port() {
    insta::assert_snapshot!(text(&spec(vec![tcp(8080, 9080), udp(8080, 9081)], &[POD4])));
}

#[test]
fn ipv4_and_ipv6() {
    insta::assert_snapshot!(text(&spec(vec![tcp(8080, 9080), udp(8080, 9081)], &[POD4, POD6])));
}

#[test]
fn pass_through() {
    let i = Intercept { proxy_port: Some(9180), ..tcp(8080, 9080) };
    insta::assert_snapshot!(text(&spec(vec![i], &[POD4, POD6])));
}

#[test]
fn uid_identity() {
    let s = InterceptSpec { identity: AgentIdentity::User(1000), ..spec(vec![tcp(8080, 9080)], &[POD4]) };
    insta::assert_snapshot!(text(&s));
}

#[test]
fn mark_identity() {
    let s = InterceptSpec { identity: AgentIdentity::Mark(0x2374), ..spec(vec![tcp(8080, 9080)], &[POD6]) };
    insta::assert_snapshot!(text(&s));
}

#[test]
fn first_agent_port_wins() {
    let c = tables(&spec(vec![tcp(8080, 9080), udp(8080, 9081), tcp(8080, 9999)], &[POD4])).unwrap();
    assert_eq!(
        c.refusals,
        vec![Refusal::DuplicatePort {
            index: 2,
            protocol: Protocol::Tcp,
            container_port: 8080,
            kept: 0,
            kept_agent_port: 9080
        }]
    );
    let map = c.tables[0].sets.iter().find(|s| s.name == REDIRECT_PORTS).unwrap();
    assert_eq!(map.elements.len(), 2);
    assert_eq!(
        c.refusals[0].to_string(),
        "intercepts[2]: Tcp port 8080 is already intercepted by intercepts[0] (agent port 9080); the first agent port wins"
    );
}

#[test]
fn ports_out_of_range_are_refused() {
    let bad =
        vec![tcp(0, 9080), tcp(8080, 70000), Intercept { proxy_port: Some(65536), ..tcp(8081, 9081) }, tcp(8082, 9082)];
    let c = tables(&spec(bad, &[POD4])).unwrap();
    assert_eq!(
        c.refusals,
        vec![
            Refusal::PortOutOfRange { index: 0, field: PortField::ContainerPort, value: 0 },
            Refusal::PortOutOfRange { index: 1, field: PortField::AgentPort, value: 70000 },
            Refusal::PortOutOfRange { index: 2, field: PortField::ProxyPort, value: 65536 },
        ]
    );
    assert_eq!(c.refusals[1].to_string(), "intercepts[1].agentPort: 70000 is not a port (1-65535)");
}

#[test]
fn proxy_port_conflicts_are_refused() {
    let a = Intercept { proxy_port: Some(9180), ..tcp(8080, 9080) };
    let b = Intercept { proxy_port: Some(9180), ..tcp(8081, 9081) };
    let c = Intercept { proxy_port: Some(8080), ..tcp(8082, 9082) };
    let got = tables(&spec(vec![a, b, c], &[POD4])).unwrap().refusals;
    assert_eq!(
        got,
        vec![
            Refusal::DuplicateProxyPort { index: 1, protocol: Protocol::Tcp, proxy_port: 9180, kept: 0 },
            Refusal::ProxyPortIntercepted { index: 2, protocol: Protocol::Tcp, proxy_port: 8080 },
        ]
    );
}

#[test]
fn no_address_or_no_intercept_is_an_error() {
    assert_eq!(tables(&spec(vec![tcp(8080, 9080)], &[])), Err(SpecError::NoPodAddress));
    assert_eq!(tables(&spec(vec![tcp(0, 9080)], &[POD4])), Err(SpecError::NoIntercept));
}

#[test]
fn one_table_per_family_named_under_kuports_prefix() {
    let c = tables(&spec(vec![tcp(8080, 9080)], &[POD6, POD4])).unwrap();
    let names: Vec<_> = c.tables.iter().map(|t| (t.family, t.name.as_str())).collect();
    assert_eq!(names, vec![(NftFamily::Ip as i32, TABLE), (NftFamily::Ip6 as i32, TABLE)]);
    assert!(TABLE.starts_with(kuport_proto::owned::NFT_TABLE_PREFIX));
}
