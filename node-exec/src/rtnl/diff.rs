//! Desired versus observed: what is missing, extra or changed among the objects kuport owns.
//!
//! Each kind's plan (`link`, `address`, `neighbour`, `route`, `rule`, [`crate::sysctl`]) serves both drift
//! reporting and the executor's steps; [`diff`] names them all.

use std::fmt;

use super::{KindPlan, address, link, model::Desired, neighbour, observe::Observed, route, rule};

/// One object that is not as desired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The object as `ip` would name it: `route default via 169.254.77.3 dev kup-1 table 201`.
    pub object: String,
    pub change: Change,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Desired, absent.
    Missing,
    /// Owned by kuport, present, not desired.
    Extra,
    /// Present with other attributes; the text says which (`mtu 1400 -> 1370`).
    Changed(String),
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.change {
            Change::Missing => write!(f, "missing {}", self.object),
            Change::Extra => write!(f, "extra {}", self.object),
            Change::Changed(how) => write!(f, "changed {}: {how}", self.object),
        }
    }
}

/// Every difference between `desired` and `observed`, in the order apply would address them:
/// what is missing or changed, links first; then what is extra, rules first.
pub fn diff(desired: &Desired, observed: &Observed) -> Vec<Difference> {
    let mut out = Vec::new();
    let (links, addresses) = (link::Plan::new(desired, observed), address::Plan::new(desired, observed));
    let (routes, rules) = (route::Plan::new(desired, observed), rule::Plan::new(desired, observed));
    let neighbours = neighbour::Plan::new(desired, observed);
    links.missing(&mut out);
    crate::sysctl::plan(&desired.sysctls, &observed.sysctls).missing(&mut out);
    addresses.missing(&mut out);
    neighbours.missing(&mut out);
    routes.missing(&mut out);
    rules.missing(&mut out);
    rules.extra(&mut out);
    routes.extra(&mut out);
    neighbours.extra(&mut out);
    addresses.extra(&mut out);
    links.extra(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use ipnet::{IpNet, Ipv4Net};

    use super::*;
    use crate::rtnl::{
        consts::TABLE_MAIN,
        model::{LinkSpec, RouteSpec, VxlanSpec},
        observe::{ObservedLink, ObservedRoute, ObservedRule, ObservedVxlan},
    };

    fn net(s: &str) -> IpNet {
        s.parse().expect("prefix")
    }

    fn spec() -> LinkSpec {
        LinkSpec {
            name: "kup-1".into(),
            mtu: Some(1370),
            mac: None,
            vxlan: VxlanSpec {
                vni: 4201,
                local: Some("10.99.0.1".parse().expect("addr")),
                remote: Some("10.99.0.2".parse().expect("addr")),
                dstport: Some(4790),
                ttl: Some(64),
            },
        }
    }

    fn link(index: u32, name: &str, vxlan: Option<ObservedVxlan>) -> ObservedLink {
        ObservedLink {
            index,
            name: name.into(),
            mtu: 1370,
            admin_up: true,
            oper_state: "UNKNOWN".into(),
            kind: vxlan.as_ref().map(|_| "vxlan".into()),
            vxlan,
            mac: None,
        }
    }

    fn vx() -> ObservedVxlan {
        ObservedVxlan {
            vni: 4201,
            local: Some("10.99.0.1".parse().expect("addr")),
            remote: Some("10.99.0.2".parse().expect("addr")),
            dstport: 4790,
            ttl: 64,
        }
    }

    fn route(table: u32, dst: &str, dev: &str, kernel: bool) -> ObservedRoute {
        ObservedRoute {
            table,
            dst: net(dst),
            via: None,
            dev: Some(dev.into()),
            priority: 0,
            kernel,
            plain: true,
            msg: Default::default(),
        }
    }

    fn rule(pref: u32, fwmark: u32, table: u32) -> ObservedRule {
        ObservedRule {
            pref,
            fwmark,
            fwmask: u32::MAX,
            to: None,
            table,
            ipv6: false,
            plain: true,
            msg: Default::default(),
        }
    }

    #[test]
    fn foreign_objects_are_never_extra() {
        let observed = Observed {
            links: vec![link(1, "eth0", None), link(2, "kup-1", Some(vx()))],
            routes: vec![
                // Someone else's, in main.
                route(TABLE_MAIN, "10.124.0.0/16", "eth0", false),
                // The kernel's connected route for kuport's address.
                route(TABLE_MAIN, "169.254.77.2/31", "kup-1", true),
            ],
            // Another mark at kuport's preference; kuport's mark at another preference.
            rules: vec![rule(101, 0x1234, TABLE_MAIN), rule(100, 0x6b70_0001, 201)],
            ..Default::default()
        };
        let desired = Desired { links: vec![spec()], ..Default::default() };
        assert_eq!(diff(&desired, &observed), []);

        // With nothing desired only kuport's link is extra.
        let all = diff(&Desired::default(), &observed);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].to_string(), "extra link kup-1");
    }

    #[test]
    fn tables_named_by_kuport_rules_are_emptied_with_them() {
        let observed = Observed {
            routes: vec![route(201, "0.0.0.0/0", "eth0", false)],
            rules: vec![rule(102, 0x6b70_0001, 201)],
            ..Default::default()
        };
        let d: Vec<String> = diff(&Desired::default(), &observed).iter().map(ToString::to_string).collect();
        assert_eq!(
            d,
            ["extra rule pref 102 fwmark 0x6b700001/0xffffffff lookup 201", "extra route default dev eth0 table 201",]
        );
    }

    #[test]
    fn a_changed_gateway_is_replaced_not_added() {
        let mut old = route(201, "0.0.0.0/0", "kup-1", false);
        old.via = Some("169.254.77.5".parse().expect("addr"));
        let observed = Observed { links: vec![link(2, "kup-1", Some(vx()))], routes: vec![old], ..Default::default() };
        let desired = Desired {
            links: vec![spec()],
            routes: vec![RouteSpec {
                table: 201,
                dst: IpNet::V4(Ipv4Net::default()),
                via: Some("169.254.77.3".parse().expect("addr")),
                dev: Some("kup-1".into()),
            }],
            ..Default::default()
        };
        let d = diff(&desired, &observed);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].to_string(),
            "changed route default via 169.254.77.3 dev kup-1 table 201: \
             via 169.254.77.5 -> 169.254.77.3"
        );
    }
}
