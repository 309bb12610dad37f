//! The executor's own line (docs/design.md, "What the executor refuses"): before anything of a
//! state is applied, every route and rule must name one of kuport's tables, every sysctl one of
//! those kuport computes, every namespace file one under the `ip netns` directories. A state
//! outside them is refused whole, naming each object, and the node keeps what it had. The sets
//! are [`kuport_proto::owned`]'s, which the controller computes from.

use kuport_proto::owned::{
    self, LINK_PREFIX, MAIN_TABLE, MAX_SLOT, NETNS_DIRS, SYSCTLS, TABLE_BASE, netns_path_allowed,
};
use kuport_proto::v1::{NetnsState, NodeState, ObjectError, netns_ref};

/// Every object of `state` outside kuport's line; empty when the state may be applied.
pub fn check(state: &NodeState) -> Vec<ObjectError> {
    let mut out = Vec::new();
    for ns in &state.netns {
        check_netns(ns, &mut out);
    }
    out
}

fn check_netns(ns: &NetnsState, out: &mut Vec<ObjectError>) {
    let at = ns.describe();
    let mut refuse =
        |object: String, reason: String| out.push(ObjectError { object: format!("{object} in {at}"), reason });
    if let Some(netns_ref::Kind::Path(p)) = ns.target.as_ref().and_then(|t| t.kind.as_ref())
        && !netns_path_allowed(p)
    {
        refuse(
            format!("network namespace {p:?}"),
            format!("not a namespace file kuport may enter: only a name directly under {}", NETNS_DIRS.join(" or ")),
        );
    }
    let slots = format!("{} to {}", TABLE_BASE + 1, TABLE_BASE + MAX_SLOT);
    for r in &ns.routes {
        if !owned::route_allowed(r.table, &r.dev) {
            let via = if r.via.is_empty() { String::new() } else { format!(" via {}", r.via) };
            refuse(
                format!("route {}{via} dev {} table {}", r.dst, r.dev, r.table),
                format!(
                    "table {} is not kuport's: routes go only in a slot's table ({slots}) or in main ({MAIN_TABLE}) on a {LINK_PREFIX}* link",
                    r.table
                ),
            );
        }
    }
    for r in &ns.ip_rules {
        if !owned::rule_table_allowed(r.table) {
            refuse(
                format!("rule pref {} fwmark {:#x} lookup {}", r.pref, r.fwmark, r.table),
                format!(
                    "table {} is not kuport's: rules look up only a slot's table ({slots}) or main ({MAIN_TABLE})",
                    r.table
                ),
            );
        }
    }
    for s in &ns.sysctls {
        if !SYSCTLS.contains(&s.key.as_str()) {
            refuse(format!("sysctl {}", s.key), format!("kuport sets only {}", SYSCTLS.join(" and ")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_proto::v1::{IpRule, Route, Sysctl};

    #[test]
    fn a_foreign_table_sysctl_or_file_is_named() {
        let ns = NetnsState {
            target: kuport_proto::netns::path("/proc/1/ns/net"),
            routes: vec![
                Route { table: 201, dst: "default".into(), via: "169.254.77.3".into(), dev: "kup-1".into() },
                Route { table: 254, dst: "10.0.0.0/8".into(), via: String::new(), dev: "kup-wg".into() },
                Route { table: 100, dst: "default".into(), via: String::new(), dev: "kup-1".into() },
                Route { table: 254, dst: "default".into(), via: "192.0.2.1".into(), dev: "eth0".into() },
            ]
            .into(),
            ip_rules: vec![
                IpRule { pref: 101, fwmark: 0x6b70_0001, fwmask: u32::MAX, table: 254, ..Default::default() },
                IpRule { pref: 102, fwmark: 0x6b70_0001, fwmask: u32::MAX, table: 255, ..Default::default() },
            ],
            sysctls: vec![
                Sysctl { key: "net.ipv4.ip_forward".into(), value: "1".into() },
                Sysctl { key: "kernel.core_pattern".into(), value: "|/tmp/x".into() },
            ],
            ..Default::default()
        };
        let errors = check(&NodeState { node: "n".into(), netns: vec![ns] });
        let objects: Vec<&str> = errors.iter().map(|e| e.object.as_str()).collect();
        assert_eq!(
            objects,
            [
                "network namespace \"/proc/1/ns/net\" in /proc/1/ns/net",
                "route default dev kup-1 table 100 in /proc/1/ns/net",
                "route default via 192.0.2.1 dev eth0 table 254 in /proc/1/ns/net",
                "rule pref 102 fwmark 0x6b700001 lookup 255 in /proc/1/ns/net",
                "sysctl kernel.core_pattern in /proc/1/ns/net",
            ]
        );
        assert!(errors[1].reason.contains("table 100 is not kuport's"), "{}", errors[1].reason);
    }
}
