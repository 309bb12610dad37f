//! Routes: one per table and destination, the kernel's own key (kuport never sets a metric).
//! kuport owns the routes in the tables its routes and rules name (other than the reserved ones)
//! and the routes on its links, never the kernel's `proto kernel` routes. Both families take
//! the same path; an IPv6 route's family follows its destination, as its gateway's does.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::{
    AddressFamily,
    route::{RouteAddress, RouteAttribute, RouteProtocol, RouteScope},
};
use rtnetlink::RouteMessageBuilder;

use super::{
    KindPlan,
    consts::{RESERVED_TABLES, owns_link, owns_rule},
    diff::{Change, Difference},
    error::Op,
    model::{Desired, Dst, RouteSpec, TableName},
    observe::{Observed, ObservedRoute},
    session::Session,
};

/// A route to add, or to replace in place (NLM_F_REPLACE) when kuport's own route holds its key.
#[derive(Debug)]
pub(crate) struct RouteWrite {
    pub spec: RouteSpec,
    /// How the route kuport already has differs; None to add a new one.
    pub replace: Option<String>,
}

/// What making and breaking the routes takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub writes: Vec<RouteWrite>,
    /// kuport's routes whose key the desired state does not name.
    pub dels: Vec<ObservedRoute>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
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
        let same_key =
            |s: &RouteSpec, o: &ObservedRoute| o.table == s.table && o.dst == s.dst && o.priority == metric(&s.dst);
        let same = |s: &RouteSpec, o: &ObservedRoute| {
            same_key(s, o) && o.via == s.via && o.dev == s.dev && (o.plain || o.kernel)
        };
        let mut plan = Plan::default();
        for spec in &desired.routes {
            if observed.routes.iter().any(|o| same(spec, o)) {
                continue;
            }
            // Only kuport's own route is replaced; a foreign one holding the key makes the add
            // fail with EEXIST, which is reported rather than overwriting it.
            let replace = observed.routes.iter().find(|o| same_key(spec, o) && owned(o)).map(|o| change(o, spec));
            plan.writes.push(RouteWrite { spec: spec.clone(), replace });
        }
        plan.dels = observed
            .routes
            .iter()
            .filter(|o| owned(o))
            .filter(|o| !desired.routes.iter().any(|s| same_key(s, o)))
            .cloned()
            .collect();
        plan
    }

    fn missing(&self, out: &mut Vec<Difference>) {
        for w in &self.writes {
            let change = match &w.replace {
                Some(how) => Change::Changed(how.clone()),
                None => Change::Missing,
            };
            out.push(Difference { object: w.spec.to_string(), change });
        }
    }

    fn extra(&self, out: &mut Vec<Difference>) {
        for r in &self.dels {
            out.push(Difference { object: name(r), change: Change::Extra });
        }
    }

    /// Adds or replaces the routes that differ, on the links as last observed.
    fn make(&self, s: &mut Session) {
        for w in &self.writes {
            write(s, &w.spec, w.replace.is_some());
        }
    }

    /// Deletes kuport's routes no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for r in &self.dels {
            let req = s.handle().route().del(r.msg.clone()).execute();
            if !s.write(Op::Delete, name(r), req) {
                return false;
            }
        }
        true
    }
}

/// The metric the kernel gives a route added without one: kuport never sets one, and IPv6
/// turns 0 into 1024 (IP6_RT_PRIO_USER).
pub(crate) fn metric(dst: &IpNet) -> u32 {
    match dst {
        IpNet::V4(_) => 0,
        IpNet::V6(_) => 1024,
    }
}

fn route_address(a: IpAddr) -> RouteAddress {
    match a {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn write(s: &mut Session, r: &RouteSpec, replace: bool) {
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .table_id(r.table)
        // What `ip route add` sets, so the route reads back the same way in `ip route`.
        .protocol(RouteProtocol::Boot);
    let msg = b.get_mut();
    msg.header.address_family = match r.dst {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    };
    if r.dst.prefix_len() > 0 {
        msg.header.destination_prefix_length = r.dst.prefix_len();
        msg.attributes.push(RouteAttribute::Destination(route_address(r.dst.addr())));
    }
    match r.via {
        // The same family as the destination (the model checks it), so RTA_GATEWAY, not RTA_VIA.
        Some(via) => msg.attributes.push(RouteAttribute::Gateway(route_address(via))),
        None => b = b.scope(RouteScope::Link),
    }
    if let Some(dev) = &r.dev {
        let Some(index) = s.index(r, dev) else { return };
        b = b.output_interface(index);
    }
    let mut req = s.handle().route().add(b.build());
    let op = if replace {
        req = req.replace();
        Op::Change
    } else {
        Op::Add
    };
    s.write(op, r.to_string(), req.execute());
}

fn change(o: &ObservedRoute, s: &RouteSpec) -> String {
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

fn opt(a: Option<IpAddr>) -> String {
    a.map_or_else(|| "none".into(), |a| a.to_string())
}

/// An observed route named as `ip` would name it.
fn name(o: &ObservedRoute) -> String {
    let mut s = format!("route {}", Dst(o.dst));
    if let Some(via) = o.via {
        s += &format!(" via {via}");
    }
    if let Some(dev) = &o.dev {
        s += &format!(" dev {dev}");
    }
    s += &format!(" table {}", TableName(o.table));
    if o.priority != metric(&o.dst) {
        s += &format!(" metric {}", o.priority);
    }
    s
}
