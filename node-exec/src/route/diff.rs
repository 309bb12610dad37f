//! Desired versus observed: what is missing, extra or changed among the objects kuport owns.
//!
//! One computation ([`Plan`]) serves both drift reporting ([`diff`]) and [`super::apply`].

use std::{collections::BTreeSet, fmt, net::Ipv4Addr};

use super::{
    consts::{RESERVED_TABLES, owns_link, owns_rule},
    model::{AddressSpec, Desired, Dst, LinkSpec, RouteSpec, RuleSpec, SysctlSpec, TableName},
    observe::{Observed, ObservedAddress, ObservedLink, ObservedRoute, ObservedRule},
};

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

/// Every difference between `desired` and `observed`, in the order apply would address them.
pub fn diff(desired: &Desired, observed: &Observed) -> Vec<Difference> {
    Plan::new(desired, observed).differences()
}

/// A link that exists and can be brought to the desired state in place (one RTM_NEWLINK).
#[derive(Debug)]
pub(crate) struct LinkChange<'d> {
    pub spec: &'d LinkSpec,
    pub index: u32,
    pub mtu: Option<u32>,
    pub local: Option<Option<Ipv4Addr>>,
    pub remote: Option<Option<Ipv4Addr>>,
    pub ttl: Option<u8>,
    pub up: bool,
    /// What differs, for the report.
    pub how: Vec<String>,
}

/// A link that must be deleted and created again: the kernel refuses to change these attributes
/// of a VXLAN link in place ("Cannot change VNI", "Cannot change port"), or it is another kind.
#[derive(Debug)]
pub(crate) struct LinkRecreate<'d> {
    pub spec: &'d LinkSpec,
    pub index: u32,
    pub how: Vec<String>,
}

/// A route to add, or to replace in place (NLM_F_REPLACE) when kuport's own route holds its key.
#[derive(Debug)]
pub(crate) struct RouteWrite<'d> {
    pub spec: &'d RouteSpec,
    /// How the route kuport already has differs; None to add a new one.
    pub replace: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Plan<'d, 'o> {
    pub creates: Vec<&'d LinkSpec>,
    pub changes: Vec<LinkChange<'d>>,
    pub recreates: Vec<LinkRecreate<'d>>,
    pub sysctls: Vec<(&'d SysctlSpec, Option<&'o str>)>,
    pub addr_adds: Vec<&'d AddressSpec>,
    pub route_writes: Vec<RouteWrite<'d>>,
    pub rule_adds: Vec<&'d RuleSpec>,
    pub rule_dels: Vec<&'o ObservedRule>,
    pub route_dels: Vec<&'o ObservedRoute>,
    pub addr_dels: Vec<&'o ObservedAddress>,
    pub link_dels: Vec<&'o ObservedLink>,
}

impl<'d, 'o> Plan<'d, 'o> {
    pub fn new(desired: &'d Desired, observed: &'o Observed) -> Self {
        let mut plan = Plan::default();
        plan.links(desired, observed);
        for s in &desired.sysctls {
            let current = observed.sysctls.get(&s.key).map(String::as_str);
            let same = current.is_some_and(|c| c.split_whitespace().eq(s.value.split_whitespace()));
            if !same {
                plan.sysctls.push((s, current));
            }
        }
        plan.addresses(desired, observed);
        plan.routes(desired, observed);
        plan.rules(desired, observed);
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.creates.is_empty()
            && self.changes.is_empty()
            && self.recreates.is_empty()
            && self.sysctls.is_empty()
            && self.addr_adds.is_empty()
            && self.route_writes.is_empty()
            && self.rule_adds.is_empty()
            && self.rule_dels.is_empty()
            && self.route_dels.is_empty()
            && self.addr_dels.is_empty()
            && self.link_dels.is_empty()
    }

    fn links(&mut self, desired: &'d Desired, observed: &'o Observed) {
        for spec in &desired.links {
            let Some(have) = observed.link(&spec.name) else {
                self.creates.push(spec);
                continue;
            };
            let want = &spec.vxlan;
            let Some(vx) = have.vxlan.as_ref().filter(|_| have.kind.as_deref() == Some("vxlan")) else {
                let kind = have.kind.as_deref().unwrap_or("none");
                self.recreates.push(LinkRecreate {
                    spec,
                    index: have.index,
                    how: vec![format!("kind {kind} -> vxlan")],
                });
                continue;
            };
            let mut fixed = Vec::new();
            if vx.vni != want.vni {
                fixed.push(format!("vni {} -> {}", vx.vni, want.vni));
            }
            if let Some(port) = want.dstport.filter(|p| *p != vx.dstport) {
                fixed.push(format!("dstport {} -> {port}", vx.dstport));
            }
            if !fixed.is_empty() {
                self.recreates.push(LinkRecreate { spec, index: have.index, how: fixed });
                continue;
            }
            let mut ch = LinkChange {
                spec,
                index: have.index,
                mtu: None,
                local: None,
                remote: None,
                ttl: None,
                up: false,
                how: Vec::new(),
            };
            if let Some(mtu) = spec.mtu.filter(|m| *m != have.mtu) {
                ch.how.push(format!("mtu {} -> {mtu}", have.mtu));
                ch.mtu = Some(mtu);
            }
            if vx.local != want.local {
                ch.how.push(format!("local {} -> {}", opt(vx.local), opt(want.local)));
                ch.local = Some(want.local);
            }
            if vx.remote != want.remote {
                ch.how.push(format!("remote {} -> {}", opt(vx.remote), opt(want.remote)));
                ch.remote = Some(want.remote);
            }
            let ttl = want.ttl.unwrap_or(0);
            if vx.ttl != ttl {
                ch.how.push(format!("ttl {} -> {ttl}", vx.ttl));
                ch.ttl = Some(ttl);
            }
            if !have.admin_up {
                ch.how.push("down -> up".into());
                ch.up = true;
            }
            if !ch.how.is_empty() {
                self.changes.push(ch);
            }
        }
        let wanted: BTreeSet<&str> = desired.links.iter().map(|l| l.name.as_str()).collect();
        self.link_dels =
            observed.links.iter().filter(|l| owns_link(&l.name) && !wanted.contains(l.name.as_str())).collect();
    }

    fn addresses(&mut self, desired: &'d Desired, observed: &'o Observed) {
        let has = |a: &AddressSpec| observed.addresses.iter().any(|o| o.dev == a.dev && o.net == a.net);
        self.addr_adds = desired.addresses.iter().filter(|a| !has(a)).collect();
        self.addr_dels = observed
            .addresses
            .iter()
            .filter(|o| owns_link(&o.dev))
            .filter(|o| !desired.addresses.iter().any(|a| a.dev == o.dev && a.net == o.net))
            .collect();
    }

    fn routes(&mut self, desired: &'d Desired, observed: &'o Observed) {
        // Tables kuport owns: those it wants, and those its rules still point at (so a table is
        // emptied when the last rule and route naming it go away).
        let mut tables = desired.tables();
        tables.extend(
            observed
                .rules
                .iter()
                .filter(|r| owns_rule(r.pref, r.fwmark))
                .map(|r| r.table)
                .filter(|t| !RESERVED_TABLES.contains(t)),
        );
        let owned =
            |o: &ObservedRoute| !o.kernel && (tables.contains(&o.table) || o.dev.as_deref().is_some_and(owns_link));
        let same_key = |s: &RouteSpec, o: &ObservedRoute| o.table == s.table && o.dst == s.dst && o.priority == 0;
        let same = |s: &RouteSpec, o: &ObservedRoute| {
            same_key(s, o) && o.via == s.via && o.dev == s.dev && (o.plain || o.kernel)
        };
        for spec in &desired.routes {
            if observed.routes.iter().any(|o| same(spec, o)) {
                continue;
            }
            // Only kuport's own route is replaced; a foreign one holding the key makes the add
            // fail with EEXIST, which is reported rather than overwriting it.
            let replace = observed.routes.iter().find(|o| same_key(spec, o) && owned(o)).map(|o| route_change(o, spec));
            self.route_writes.push(RouteWrite { spec, replace });
        }
        self.route_dels = observed
            .routes
            .iter()
            .filter(|o| owned(o))
            .filter(|o| !desired.routes.iter().any(|s| same_key(s, o)))
            .collect();
    }

    fn rules(&mut self, desired: &'d Desired, observed: &'o Observed) {
        let mut used = vec![false; observed.rules.len()];
        for spec in &desired.rules {
            let found = observed.rules.iter().enumerate().find(|(i, o)| !used[*i] && o.plain && rule_is(o, spec));
            match found {
                Some((i, _)) => used[i] = true,
                None => self.rule_adds.push(spec),
            }
        }
        self.rule_dels = observed
            .rules
            .iter()
            .enumerate()
            .filter(|(i, o)| !used[*i] && owns_rule(o.pref, o.fwmark))
            .map(|(_, o)| o)
            .collect();
    }

    fn differences(&self) -> Vec<Difference> {
        let mut out = Vec::new();
        let mut push = |object: String, change: Change| out.push(Difference { object, change });
        for s in &self.creates {
            push(s.to_string(), Change::Missing);
        }
        for r in &self.recreates {
            push(r.spec.to_string(), Change::Changed(r.how.join(", ")));
        }
        for c in &self.changes {
            push(c.spec.to_string(), Change::Changed(c.how.join(", ")));
        }
        for (s, current) in &self.sysctls {
            match current {
                Some(v) => push(s.to_string(), Change::Changed(format!("{v} -> {}", s.value))),
                None => push(s.to_string(), Change::Missing),
            }
        }
        for a in &self.addr_adds {
            push(a.to_string(), Change::Missing);
        }
        for w in &self.route_writes {
            match &w.replace {
                Some(how) => push(w.spec.to_string(), Change::Changed(how.clone())),
                None => push(w.spec.to_string(), Change::Missing),
            }
        }
        for r in &self.rule_adds {
            push(r.to_string(), Change::Missing);
        }
        for r in &self.rule_dels {
            push(rule_name(r), Change::Extra);
        }
        for r in &self.route_dels {
            push(route_name(r), Change::Extra);
        }
        for a in &self.addr_dels {
            push(format!("address {} dev {}", a.net, a.dev), Change::Extra);
        }
        for l in &self.link_dels {
            push(format!("link {}", l.name), Change::Extra);
        }
        out
    }
}

fn opt(a: Option<Ipv4Addr>) -> String {
    a.map_or_else(|| "none".into(), |a| a.to_string())
}

fn rule_is(o: &ObservedRule, s: &RuleSpec) -> bool {
    o.pref == s.pref && o.fwmark == s.fwmark && o.fwmask == s.fwmask && o.to == s.to && o.table == s.table
}

fn route_change(o: &ObservedRoute, s: &RouteSpec) -> String {
    let mut how = Vec::new();
    if o.via != s.via {
        how.push(format!("via {} -> {}", opt(o.via), opt(s.via)));
    }
    if o.dev != s.dev {
        let name = |d: &Option<String>| d.clone().unwrap_or_else(|| "none".into());
        how.push(format!("dev {} -> {}", name(&o.dev), name(&s.dev)));
    }
    if how.is_empty() {
        how.push("extra attributes".into());
    }
    how.join(", ")
}

/// An observed route named as `ip` would name it.
pub(crate) fn route_name(o: &ObservedRoute) -> String {
    let mut s = format!("route {}", Dst(o.dst));
    if let Some(via) = o.via {
        s += &format!(" via {via}");
    }
    if let Some(dev) = &o.dev {
        s += &format!(" dev {dev}");
    }
    s += &format!(" table {}", TableName(o.table));
    if o.priority != 0 {
        s += &format!(" metric {}", o.priority);
    }
    s
}

/// An observed rule named as `ip` would name it.
pub(crate) fn rule_name(o: &ObservedRule) -> String {
    let mut s = format!("rule pref {} fwmark {:#x}/{:#x}", o.pref, o.fwmark, o.fwmask);
    if let Some(to) = o.to {
        s += &format!(" to {to}");
    }
    s += &format!(" lookup {}", TableName(o.table));
    if !o.plain {
        s += " (with other selectors)";
    }
    s
}

#[cfg(test)]
mod tests {
    use ipnet::Ipv4Net;

    use super::*;
    use crate::route::{
        consts::TABLE_MAIN,
        model::VxlanSpec,
        observe::{Observed, ObservedVxlan},
    };

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("prefix")
    }

    fn spec() -> LinkSpec {
        LinkSpec {
            name: "kup-1".into(),
            mtu: Some(1370),
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
        ObservedRule { pref, fwmark, fwmask: u32::MAX, to: None, table, plain: true, msg: Default::default() }
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
    fn in_place_changes_and_recreations_are_told_apart() {
        let mut have = vx();
        have.remote = Some("10.99.0.9".parse().expect("addr"));
        have.ttl = 0;
        let mut l = link(2, "kup-1", Some(have));
        l.mtu = 1500;
        l.admin_up = false;
        let observed = Observed { links: vec![l], ..Default::default() };
        let desired = Desired { links: vec![spec()], ..Default::default() };
        let plan = Plan::new(&desired, &observed);
        assert!(plan.recreates.is_empty() && plan.creates.is_empty());
        assert_eq!(
            plan.changes[0].how,
            ["mtu 1500 -> 1370", "remote 10.99.0.9 -> 10.99.0.2", "ttl 0 -> 64", "down -> up"]
        );

        let mut other_port = vx();
        other_port.dstport = 8472;
        let observed = Observed { links: vec![link(2, "kup-1", Some(other_port))], ..Default::default() };
        let plan = Plan::new(&desired, &observed);
        assert!(plan.changes.is_empty());
        assert_eq!(plan.recreates[0].how, ["dstport 8472 -> 4790"]);
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
                dst: Ipv4Net::default(),
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
