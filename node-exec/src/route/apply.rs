//! Making the kernel match the desired state, make-before-break, with as few writes as possible.
//!
//! Order: create missing links (up), change existing ones in place, sysctls, addresses, routes,
//! rules; then, only if every one of those succeeded, remove extra rules, routes, addresses and
//! finally links, stopping at the first failed removal. A state that already holds costs only the
//! dumps: zero writes.

use std::{fmt, net::IpAddr, path::Path};

use kuport_proto::v1::NetnsState;
use netlink_packet_route::{
    link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    route::{RouteProtocol, RouteScope},
    rule::{RuleAction, RuleAttribute},
};
use rtnetlink::{Handle, LinkVxlan, RouteMessageBuilder};

use super::{
    diff::{LinkChange, Plan, route_name, rule_name},
    error::{ApplyError, Error, Op},
    model::{AddressSpec, Desired, LinkSpec, RouteSpec, RuleSpec},
    netns,
    observe::{self, Observed},
    sysctl,
};

/// What one apply wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Netlink write requests and sysctl writes sent, refused ones included.
    pub writes: usize,
    /// The writes that succeeded, in order: `add route default via ... table 201`.
    pub actions: Vec<String>,
}

impl fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} write(s)", self.writes)?;
        for a in &self.actions {
            write!(f, "\n  {a}")?;
        }
        Ok(())
    }
}

/// Applies the link/address/route/rule/sysctl part of `state` to the namespace `netns` (None: the
/// caller's). Blocks the calling thread; the work runs on a thread of its own inside the namespace.
pub fn apply(netns: Option<&Path>, state: &NetnsState) -> Result<ApplyReport, ApplyError> {
    let desired =
        Desired::from_proto(state).map_err(|e| ApplyError { report: ApplyReport::default(), errors: vec![e] })?;
    apply_desired(netns, &desired)
}

/// [`apply`] for an already validated state.
pub fn apply_desired(netns: Option<&Path>, desired: &Desired) -> Result<ApplyReport, ApplyError> {
    let outcome = netns::run_netlink(netns, |handle| async move {
        let mut w = Writer { handle, report: ApplyReport::default(), errors: Vec::new() };
        w.run(desired).await;
        Ok((w.report, w.errors))
    });
    match outcome {
        Ok((report, errors)) if errors.is_empty() => Ok(report),
        Ok((report, errors)) => Err(ApplyError { report, errors }),
        Err(e) => Err(ApplyError { report: ApplyReport::default(), errors: vec![e] }),
    }
}

struct Writer {
    handle: Handle,
    report: ApplyReport,
    errors: Vec<Error>,
}

/// errnos that mean a removal's object is already gone.
const GONE: [i32; 3] = [libc::ENOENT, libc::ESRCH, libc::ENODEV];

impl Writer {
    async fn run(&mut self, desired: &Desired) {
        let Some(observed) = self.observe(desired).await else {
            return;
        };
        let plan = Plan::new(desired, &observed);
        if plan.is_empty() {
            return;
        }

        self.links(&plan).await;
        // New and recreated links have new indexes, and a recreated link lost its addresses and
        // routes: plan the rest against what the kernel has now.
        let reread;
        let (plan, observed) = if self.report.writes > 0 {
            let Some(o) = self.observe(desired).await else {
                return;
            };
            reread = o;
            (Plan::new(desired, &reread), &reread)
        } else {
            (plan, &observed)
        };

        for (spec, _) in &plan.sysctls {
            self.report.writes += 1;
            match sysctl::ensure(spec) {
                Ok(_) => self.done(format!("set {spec} = {}", spec.value)),
                Err(e) => self.errors.push(e),
            }
        }
        for a in &plan.addr_adds {
            self.add_address(a, observed).await;
        }
        for r in &plan.route_writes {
            self.write_route(r.spec, r.replace.is_some(), observed).await;
        }
        for r in &plan.rule_adds {
            self.add_rule(r).await;
        }

        // Never break what works because something new failed.
        if !self.errors.is_empty() {
            return;
        }
        self.removals(&plan).await;
    }

    async fn observe(&mut self, desired: &Desired) -> Option<Observed> {
        let mut observed = match observe::dump(&self.handle).await {
            Ok(o) => o,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        // A sysctl that cannot be read is reported by the write attempt.
        observed.sysctls =
            desired.sysctls.iter().filter_map(|s| Some((s.key.clone(), sysctl::read(&s.key).ok()?))).collect();
        Some(observed)
    }

    fn done(&mut self, action: String) {
        self.report.actions.push(action);
    }

    /// Sends one write; records success or the kernel's refusal.
    async fn write<F>(&mut self, op: Op, object: String, req: F) -> bool
    where
        F: Future<Output = Result<(), rtnetlink::Error>>,
    {
        self.report.writes += 1;
        match req.await {
            Ok(()) => {
                self.done(format!("{op} {object}"));
                true
            }
            Err(e) => {
                let err = Error::kernel(op, &object, e);
                if op == Op::Delete && err.errno().is_some_and(|n| GONE.contains(&n)) {
                    self.done(format!("{op} {object} (already gone)"));
                    return true;
                }
                self.errors.push(err);
                false
            }
        }
    }

    async fn links(&mut self, plan: &Plan<'_, '_>) {
        for r in &plan.recreates {
            // The kernel cannot change these in place; the link's routes come back below.
            let object = format!("{} ({})", r.spec, r.how.join(", "));
            let del = self.handle.link().del(r.index).execute();
            if self.write(Op::Delete, object, del).await {
                self.create_link(r.spec).await;
            }
        }
        for spec in &plan.creates {
            self.create_link(spec).await;
        }
        for ch in &plan.changes {
            self.change_link(ch).await;
        }
    }

    async fn create_link(&mut self, spec: &LinkSpec) {
        let vx = &spec.vxlan;
        let mut b = LinkVxlan::new(&spec.name, vx.vni);
        if let Some(local) = vx.local {
            b = b.local(local);
        }
        if let Some(remote) = vx.remote {
            b = b.remote(remote);
        }
        if let Some(port) = vx.dstport {
            b = b.port(port);
        }
        if let Some(ttl) = vx.ttl {
            b = b.ttl(ttl);
        }
        if let Some(mtu) = spec.mtu {
            b = b.mtu(mtu);
        }
        let req = self.handle.link().add(b.up().build()).execute();
        self.write(Op::Add, spec.to_string(), req).await;
    }

    /// One RTM_NEWLINK on the existing ifindex carrying only what differs: the kernel's vxlan
    /// changelink takes a new local, remote and ttl in place (and refuses any port attribute, so
    /// none is sent).
    async fn change_link(&mut self, ch: &LinkChange<'_>) {
        let mut msg = LinkMessage::default();
        msg.header.index = ch.index;
        if ch.up {
            msg.header.flags |= LinkFlags::Up;
            msg.header.change_mask |= LinkFlags::Up;
        }
        if let Some(mtu) = ch.mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        let mut data = Vec::new();
        if let Some(local) = ch.local {
            data.push(InfoVxlan::Local(local.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED)));
        }
        if let Some(remote) = ch.remote {
            data.push(InfoVxlan::Group(remote.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED)));
        }
        if let Some(ttl) = ch.ttl {
            data.push(InfoVxlan::Ttl(ttl));
        }
        if !data.is_empty() {
            msg.attributes.push(LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vxlan),
                LinkInfo::Data(InfoData::Vxlan(data)),
            ]));
        }
        let object = format!("{} ({})", ch.spec, ch.how.join(", "));
        let req = self.handle.link().change(msg).execute();
        self.write(Op::Change, object, req).await;
    }

    fn index(&mut self, object: &dyn fmt::Display, dev: &str, observed: &Observed) -> Option<u32> {
        let index = observed.link(dev).map(|l| l.index);
        if index.is_none() {
            self.errors.push(Error::NoDevice { object: object.to_string(), dev: dev.to_string() });
        }
        index
    }

    async fn add_address(&mut self, a: &AddressSpec, observed: &Observed) {
        let Some(index) = self.index(a, &a.dev, observed) else {
            return;
        };
        let req = self.handle.address().add(index, IpAddr::V4(a.net.addr()), a.net.prefix_len()).execute();
        self.write(Op::Add, a.to_string(), req).await;
    }

    async fn write_route(&mut self, r: &RouteSpec, replace: bool, observed: &Observed) {
        let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
            .table_id(r.table)
            // What `ip route add` sets, so the route reads back the same way in `ip route`.
            .protocol(RouteProtocol::Boot);
        if r.dst.prefix_len() > 0 {
            b = b.destination_prefix(r.dst.addr(), r.dst.prefix_len());
        }
        match r.via {
            Some(via) => b = b.gateway(via),
            None => b = b.scope(RouteScope::Link),
        }
        if let Some(dev) = &r.dev {
            let Some(index) = self.index(r, dev, observed) else {
                return;
            };
            b = b.output_interface(index);
        }
        let mut req = self.handle.route().add(b.build());
        let op = if replace {
            req = req.replace();
            Op::Change
        } else {
            Op::Add
        };
        self.write(op, r.to_string(), req.execute()).await;
    }

    async fn add_rule(&mut self, r: &RuleSpec) {
        let mut req = self
            .handle
            .rule()
            .add()
            .v4()
            .priority(r.pref)
            .fw_mark(r.fwmark)
            .table_id(r.table)
            .action(RuleAction::ToTable);
        if let Some(to) = r.to {
            req = req.destination_prefix(to.addr(), to.prefix_len());
        }
        req.message_mut().attributes.push(RuleAttribute::FwMask(r.fwmask));
        self.write(Op::Add, r.to_string(), req.execute()).await;
    }

    /// Rules, then routes, then addresses, then links, so nothing is removed while a rule or route
    /// still uses it. Stops at the first failure.
    async fn removals(&mut self, plan: &Plan<'_, '_>) {
        for r in &plan.rule_dels {
            let req = self.handle.rule().del(r.msg.clone()).execute();
            if !self.write(Op::Delete, rule_name(r), req).await {
                return;
            }
        }
        for r in &plan.route_dels {
            let req = self.handle.route().del(r.msg.clone()).execute();
            if !self.write(Op::Delete, route_name(r), req).await {
                return;
            }
        }
        for a in &plan.addr_dels {
            let req = self.handle.address().del(a.msg.clone()).execute();
            let object = format!("address {} dev {}", a.net, a.dev);
            if !self.write(Op::Delete, object, req).await {
                return;
            }
        }
        for l in &plan.link_dels {
            let req = self.handle.link().del(l.index).execute();
            if !self.write(Op::Delete, format!("link {}", l.name), req).await {
                return;
            }
        }
    }
}
