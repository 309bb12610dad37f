//! One apply as ordered steps, one per kind of object. Each step says once what makes two of
//! its objects the same one, how it reads the kernel's (observe), compares them with the desired
//! ones (plan), adds or changes what differs (make) and removes what kuport owns and no longer
//! wants (break).
//!
//! [`ORDER`] is make before break: every step makes, in order, while what the new state drops is
//! still there; then every step breaks, in reverse, so that nothing goes while something still
//! uses it (a table's elements name links, a rule names a route table, a route a link, an
//! address a WireGuard device). A step
//! that meets a refusal stops the apply there: what already works is never torn down for
//! something new that failed.
//!
//! The steps before the nftables one run on a thread inside the namespace, in one rtnetlink
//! [`rtnl::Session`] (links, WireGuard devices, addresses, neighbours, routes and rules share
//! its dump; WireGuard's own backends talk from that thread too); the executor skips
//! them all while their part of the state is unchanged and known to hold.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Instant, SystemTime};

use kuport_proto::owned;
use kuport_proto::v1::{NetnsState, NftFamily, NftTable};
use netlink_packet_route::link::{LinkFlags, LinkMessage};

use super::{ObjectError, Report};
use crate::rtnl::{self, KindPlan, address, link, neighbour, route, rule};
use crate::wireguard::{self, BackendKind, Wireguard, model};
use crate::{nft, sysctl};

/// The kinds of object, with what identifies one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `kup-*` links, by name.
    Links,
    /// WireGuard devices (`kup-*` links of their own step), by name, and their peers, by
    /// public key: after the links, before the addresses and routes that name them. A device
    /// that leaves the state goes with the links (it is a `kup-*` link); a peer that leaves it
    /// is removed in break, after every new peer is in.
    Wireguard,
    /// Sysctls, by key; never reverted, so never broken (other software may depend on them).
    /// After the links: a per-link key exists only once its link does.
    Sysctls,
    /// Addresses on `kup-*` links, by link and prefix.
    Addresses,
    /// Permanent neighbour entries on `kup-*` links, by link and address: the far end of each
    /// link at its computed MAC (docs/portmap/links.md). After the links they sit on.
    Neighbours,
    /// Routes, by table and destination (the kernel's key; kuport sets no metric).
    Routes,
    /// Rules at kuport's preferences with its marks, by preference, mark, mask, destination and
    /// table.
    Rules,
    /// nftables tables whose name starts with [`owned::NFT_TABLE_PREFIX`], by family and name.
    NftTables,
}

/// The order of one apply's make; break runs it backwards.
pub const ORDER: [Kind; 8] = [
    Kind::Links,
    Kind::Wireguard,
    Kind::Sysctls,
    Kind::Addresses,
    Kind::Neighbours,
    Kind::Routes,
    Kind::Rules,
    Kind::NftTables,
];

/// A table's identity: its family and name.
pub(crate) type TableId = (i32, String);

/// What the kernel or validation refused, in the words of the module that met it.
#[derive(Debug)]
pub(crate) enum Refusal {
    Rtnl(rtnl::Error),
    Nft { table: String, error: nft::NftError },
    Wireguard(wireguard::Error),
}

impl Refusal {
    pub(crate) fn object_error(self) -> ObjectError {
        match self {
            Refusal::Rtnl(e) => rtnl_error(e),
            Refusal::Nft { table, error } => nft_error(&table, error),
            Refusal::Wireguard(e) => wireguard_error(e),
        }
    }
}

/// A step stopped the apply; its refusals are in [`Cx::refusals`].
#[derive(Debug)]
pub(crate) struct Stopped;

/// What the steps of one apply share.
pub(crate) struct Cx<'a> {
    /// The namespace (None: the caller's).
    pub netns: Option<&'a Path>,
    pub state: &'a NetnsState,
    /// `state`'s links, addresses, routes, rules and sysctls, validated.
    pub objects: &'a rtnl::Desired,
    /// The namespace's rtnetlink session, while the steps that need it run.
    pub rtnl: Option<&'a mut rtnl::Session>,
    /// The node's WireGuard key and backends, when the executor has them.
    pub wg: Option<&'a Wireguard>,
    /// What was written, in order.
    pub report: Report,
    /// What was refused.
    pub refusals: Vec<Refusal>,
}

impl<'a> Cx<'a> {
    pub(crate) fn new(netns: Option<&'a Path>, state: &'a NetnsState, objects: &'a rtnl::Desired) -> Self {
        Cx { netns, state, objects, rtnl: None, wg: None, report: Report::default(), refusals: Vec::new() }
    }

    /// The session and the desired objects; refused when no session is open.
    fn rtnl(&mut self) -> Result<(&'a rtnl::Desired, &mut rtnl::Session), Stopped> {
        match self.rtnl.as_deref_mut() {
            Some(s) => Ok((self.objects, s)),
            None => {
                self.refusals.push(Refusal::Rtnl(rtnl::Error::Io {
                    what: "rtnetlink session",
                    source: std::io::Error::other("not open"),
                }));
                Err(Stopped)
            }
        }
    }

    /// Moves the session's writes and refusals into the apply's; Err if it refused anything.
    fn settle(&mut self) -> Result<(), Stopped> {
        let Some(s) = self.rtnl.as_deref_mut() else { return Ok(()) };
        let clean = s.clean();
        let (written, errors) = s.take();
        self.report.writes += written.writes;
        self.report.actions.extend(written.actions);
        self.refusals.extend(errors.into_iter().map(Refusal::Rtnl));
        if clean { Ok(()) } else { Err(Stopped) }
    }

    fn refuse(&mut self, r: Refusal) -> Stopped {
        self.refusals.push(r);
        Stopped
    }
}

/// One kind of object (see the module).
pub(crate) trait Step: Send {
    fn kind(&self) -> Kind;
    /// Reads what the kernel holds of this kind.
    fn observe(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped>;
    /// Compares it with the desired objects; the plan is kept for make and break.
    fn plan(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped>;
    /// The plan named as drift reports it: what is missing or changed, what is extra.
    fn differences(&self, missing: &mut Vec<String>, extra: &mut Vec<String>);
    /// Adds or changes what the plan says; what the new state drops stays.
    fn make(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped>;
    /// Removes what the plan says kuport owns and no longer wants.
    fn brk(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped>;
}

/// Every step observes, plans and makes, in order; then every step breaks, in reverse. Stops at
/// the first step that meets a refusal.
pub(crate) fn make_then_break(steps: &mut [&mut dyn Step], cx: &mut Cx<'_>) -> Result<(), Stopped> {
    for step in steps.iter_mut() {
        let started = Instant::now();
        step.observe(cx)?;
        step.plan(cx)?;
        step.make(cx)?;
        // Where the time goes (the apply benchmark's KUPORT_BENCH_TRACE=1 prints it).
        tracing::debug!(step = ?step.kind(), took = ?started.elapsed(), "made");
    }
    for step in steps.iter_mut().rev() {
        let started = Instant::now();
        step.brk(cx)?;
        tracing::debug!(step = ?step.kind(), took = ?started.elapsed(), "broken");
    }
    Ok(())
}

/// The named differences between the desired state and the kernel, in the order an apply
/// would address them: what is missing or changed, in make order, then what is extra, in break
/// order.
pub(crate) fn differences(steps: &mut [&mut dyn Step], cx: &mut Cx<'_>) -> Result<Vec<String>, Stopped> {
    let mut missing = Vec::new();
    let mut extras = Vec::new();
    for step in steps.iter_mut() {
        step.observe(cx)?;
        step.plan(cx)?;
        let mut extra = Vec::new();
        step.differences(&mut missing, &mut extra);
        extras.push(extra);
    }
    missing.extend(extras.into_iter().rev().flatten());
    Ok(missing)
}

/// The steps that run in the namespace's rtnetlink session, in [`ORDER`].
pub(crate) struct Objects {
    links: Rtnl<link::Plan>,
    wireguard: WireguardStep,
    sysctls: Sysctls,
    addresses: Rtnl<address::Plan>,
    neighbours: Rtnl<neighbour::Plan>,
    routes: Rtnl<route::Plan>,
    rules: Rtnl<rule::Plan>,
}

impl Default for Objects {
    fn default() -> Self {
        Objects {
            links: Rtnl::new(Kind::Links),
            wireguard: WireguardStep::default(),
            sysctls: Sysctls::default(),
            addresses: Rtnl::new(Kind::Addresses),
            neighbours: Rtnl::new(Kind::Neighbours),
            routes: Rtnl::new(Kind::Routes),
            rules: Rtnl::new(Kind::Rules),
        }
    }
}

impl Objects {
    /// These steps, then `tables` when given.
    pub(crate) fn with<'s>(&'s mut self, tables: Option<&'s mut Tables<'_>>) -> Vec<&'s mut dyn Step> {
        let mut steps: Vec<&mut dyn Step> = vec![
            &mut self.links,
            &mut self.wireguard,
            &mut self.sysctls,
            &mut self.addresses,
            &mut self.neighbours,
            &mut self.routes,
            &mut self.rules,
        ];
        if let Some(t) = tables {
            steps.push(t);
        }
        steps
    }
}

/// The links, addresses, routes, rules and sysctls of `desired` alone (every step but the
/// nftables one), for [`rtnl::apply`].
pub(crate) fn apply_objects(
    netns: Option<&Path>,
    desired: &rtnl::Desired,
) -> Result<rtnl::ApplyReport, rtnl::ApplyError> {
    let state = NetnsState::default();
    let outcome = rtnl::session(netns, |s| {
        let mut cx = Cx::new(netns, &state, desired);
        cx.rtnl = Some(s);
        let _ = make_then_break(&mut Objects::default().with(None), &mut cx);
        (cx.report, cx.refusals)
    });
    let (report, refusals) = outcome.map_err(|e| rtnl::ApplyError { report: Default::default(), errors: vec![e] })?;
    let report = rtnl::ApplyReport { writes: report.writes, actions: report.actions };
    let errors: Vec<rtnl::Error> = refusals
        .into_iter()
        .filter_map(|r| match r {
            Refusal::Rtnl(e) => Some(e),
            Refusal::Nft { .. } => None,
            Refusal::Wireguard(e) => {
                let ObjectError { object, reason } = wireguard_error(e);
                Some(rtnl::Error::Invalid { object, reason })
            }
        })
        .collect();
    if errors.is_empty() { Ok(report) } else { Err(rtnl::ApplyError { report, errors }) }
}

/// A link, address, route or rule step: the kind's plan against the session's dump.
struct Rtnl<P> {
    kind: Kind,
    plan: P,
}

impl<P: KindPlan> Rtnl<P> {
    fn new(kind: Kind) -> Self {
        Rtnl { kind, plan: P::default() }
    }
}

impl<P: KindPlan> Step for Rtnl<P> {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn observe(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        // Shared: one dump serves every kind until a write makes it stale.
        let (_, s) = cx.rtnl()?;
        if let Err(e) = s.observed() {
            return Err(cx.refuse(Refusal::Rtnl(e)));
        }
        Ok(())
    }
    fn plan(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        let (objects, s) = cx.rtnl()?;
        match s.last() {
            Ok(observed) => {
                self.plan = P::new(objects, observed);
                Ok(())
            }
            Err(e) => Err(cx.refuse(Refusal::Rtnl(e))),
        }
    }
    fn differences(&self, missing: &mut Vec<String>, extra: &mut Vec<String>) {
        let (mut m, mut e) = (Vec::new(), Vec::new());
        self.plan.missing(&mut m);
        self.plan.extra(&mut e);
        named(m, missing);
        named(e, extra);
    }
    fn make(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        let (_, s) = cx.rtnl()?;
        self.plan.make(s);
        cx.settle()
    }
    fn brk(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        let (_, s) = cx.rtnl()?;
        self.plan.brk(s);
        cx.settle()
    }
}

fn named(diffs: Vec<rtnl::Difference>, out: &mut Vec<String>) {
    out.extend(diffs.iter().map(ToString::to_string));
}

/// A device's link as observed: index, kind, MTU, up.
type SeenLink = (u32, Option<String>, u32, bool);

/// One desired WireGuard device: what is there, and what makes it as desired.
#[derive(Debug)]
struct DeviceWork {
    spec: wireguard::DeviceSpec,
    /// The backend that runs it (None until it exists).
    backend: Option<BackendKind>,
    /// A link of another kind under its name (index, kind): deleted and made again.
    foreign: Option<(u32, String)>,
    plan: model::DevicePlan,
    /// The link's MTU and whether it is up, as observed (None: no link).
    link: Option<(u32, bool)>,
}

/// The WireGuard devices of the state ([`Kind::Wireguard`]): each created on the backend the
/// executor picks, given the node's key, its port and mark, and its peers one by one; its
/// MTU set and brought up through the session.
#[derive(Default)]
pub(crate) struct WireguardStep {
    work: Vec<DeviceWork>,
}

impl WireguardStep {
    fn key_holder<'w>(cx: &mut Cx<'w>) -> Result<&'w Wireguard, Stopped> {
        match cx.wg {
            Some(wg) => Ok(wg),
            None => {
                let device = cx.objects.wireguard.first().map(|d| d.name.clone()).unwrap_or_default();
                Err(cx.refuse(Refusal::Wireguard(wireguard::Error::NoKey { device })))
            }
        }
    }

    /// Sets the device's MTU and brings it up when they differ (one RTM_NEWLINK).
    fn link_settings(cx: &mut Cx<'_>, w: &DeviceWork, created: bool) -> Result<(), Stopped> {
        let (mtu, up) = match (created, w.link) {
            (true, _) | (false, None) => (w.spec.mtu, true),
            (false, Some((mtu, up))) => (w.spec.mtu.filter(|m| *m != mtu), !up),
        };
        if mtu.is_none() && !up {
            return Ok(());
        }
        let (_, s) = cx.rtnl()?;
        let index = match s.observed() {
            Ok(o) => o.link(&w.spec.name).map(|l| l.index),
            Err(e) => return Err(cx.refuse(Refusal::Rtnl(e))),
        };
        let Some(index) = index else {
            let e = wireguard::Error::Device {
                device: w.spec.name.clone(),
                op: "set mtu",
                reason: "the link is gone".into(),
            };
            return Err(cx.refuse(Refusal::Wireguard(e)));
        };
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let mut how = Vec::new();
        if up {
            msg.header.flags |= LinkFlags::Up;
            msg.header.change_mask |= LinkFlags::Up;
            how.push("up".to_string());
        }
        if let Some(m) = mtu {
            msg.attributes.push(netlink_packet_route::link::LinkAttribute::Mtu(m));
            how.push(format!("mtu {m}"));
        }
        let req = s.handle().link().change(msg).execute();
        s.write(rtnl::Op::Change, format!("link {} ({})", w.spec.name, how.join(", ")), req);
        s.stale();
        cx.settle()
    }
}

impl Step for WireguardStep {
    fn kind(&self) -> Kind {
        Kind::Wireguard
    }

    fn observe(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        self.work.clear();
        if cx.objects.wireguard.is_empty() {
            return Ok(());
        }
        let wg = Self::key_holder(cx)?;
        let (objects, s) = cx.rtnl()?;
        let links: Vec<Option<SeenLink>> = match s.observed() {
            Ok(o) => objects
                .wireguard
                .iter()
                .map(|d| o.link(&d.name).map(|l| (l.index, l.kind.clone(), l.mtu, l.admin_up)))
                .collect(),
            Err(e) => return Err(cx.refuse(Refusal::Rtnl(e))),
        };
        for (spec, link) in objects.wireguard.iter().zip(links) {
            let mut w = DeviceWork {
                spec: spec.clone(),
                backend: None,
                foreign: None,
                plan: model::DevicePlan::default(),
                link: None,
            };
            let mut device = None;
            if let Some((index, kind, mtu, up)) = link {
                match BackendKind::of_link_kind(kind.as_deref()) {
                    Some(b) => match wg.backend(b).read(&spec.name) {
                        Ok(Some(d)) => {
                            w.backend = Some(b);
                            w.link = Some((mtu, up));
                            device = Some(d);
                        }
                        // A tun link without a daemon's socket is not a WireGuard device.
                        Ok(None) => w.foreign = Some((index, kind.unwrap_or_default())),
                        Err(e) => return Err(cx.refuse(Refusal::Wireguard(e))),
                    },
                    None => w.foreign = Some((index, kind.unwrap_or_else(|| "none".into()))),
                }
            }
            w.plan = model::plan(spec, wg.key(), device.as_ref(), SystemTime::now());
            self.work.push(w);
        }
        Ok(())
    }

    fn plan(&mut self, _: &mut Cx<'_>) -> Result<(), Stopped> {
        // observe planned each device with what it read.
        Ok(())
    }

    fn differences(&self, missing: &mut Vec<String>, extra: &mut Vec<String>) {
        for w in &self.work {
            let name = &w.spec.name;
            if let Some((_, kind)) = &w.foreign {
                missing.push(format!("changed wireguard device {name}: link kind {kind} -> wireguard"));
                continue;
            }
            if w.plan.create {
                missing.push(format!("missing wireguard device {name}"));
                continue;
            }
            let mut how = w.plan.how.clone();
            if let Some((mtu, up)) = w.link {
                if let Some(m) = w.spec.mtu.filter(|m| *m != mtu) {
                    how.push(format!("mtu {mtu} -> {m}"));
                }
                if !up {
                    how.push("down -> up".into());
                }
            }
            if !how.is_empty() {
                missing.push(format!("changed wireguard device {name}: {}", how.join(", ")));
            }
            for (key, how) in &w.plan.peer_how {
                match how.as_str() {
                    "missing" => missing.push(format!("missing wireguard {name} peer {key}")),
                    "extra" => extra.push(format!("extra wireguard {name} peer {key}")),
                    how => missing.push(format!("changed wireguard {name} peer {key}: {how}")),
                }
            }
        }
    }

    fn make(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        if self.work.is_empty() {
            return Ok(());
        }
        let wg = Self::key_holder(cx)?;
        for i in 0..self.work.len() {
            let name = self.work[i].spec.name.clone();
            let refuse = |cx: &mut Cx<'_>, e| cx.refuse(Refusal::Wireguard(e));
            if let Some((_, kind)) = self.work[i].foreign.clone() {
                cx.report.writes += 1;
                if let Err(e) = wireguard::kernel::delete_link(&name) {
                    return Err(refuse(cx, e));
                }
                cx.report.actions.push(format!("delete link {name} (kind {kind} -> wireguard)"));
                self.work[i].plan.create = true;
            }
            let created = self.work[i].plan.create;
            if created {
                cx.report.writes += 1;
                match wg.create(cx.netns, &name) {
                    Ok(b) => {
                        self.work[i].backend = Some(b);
                        cx.report.actions.push(format!("add wireguard device {name} ({b})"));
                    }
                    Err(e) => return Err(refuse(cx, e)),
                }
                if let Some(s) = cx.rtnl.as_deref_mut() {
                    s.stale();
                }
                // A new device: the whole plan, against nothing.
                let spec = self.work[i].spec.clone();
                self.work[i].plan = model::plan(&spec, wg.key(), None, SystemTime::now());
            }
            let Some(backend) = self.work[i].backend.map(|b| wg.backend(b)) else { continue };
            let w = &self.work[i];
            if !w.plan.config.is_empty() {
                cx.report.writes += 1;
                if let Err(e) = backend.configure(&name, &w.plan.config) {
                    return Err(refuse(cx, e));
                }
                cx.report.actions.push(w.plan.config.describe(&name));
            }
            if !w.plan.peers.is_empty() {
                cx.report.writes += 1;
                if let Err(e) = backend.apply_peers(&name, &w.plan.peers) {
                    return Err(refuse(cx, e));
                }
                cx.report.actions.extend(w.plan.peers.iter().map(|c| c.describe(&name)));
            }
            let w = &self.work[i];
            let w = DeviceWork {
                spec: w.spec.clone(),
                backend: w.backend,
                foreign: None,
                plan: model::DevicePlan::default(),
                link: w.link,
            };
            Self::link_settings(cx, &w, created)?;
        }
        Ok(())
    }

    fn brk(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        if self.work.iter().all(|w| w.plan.removes.is_empty()) {
            return Ok(());
        }
        let wg = Self::key_holder(cx)?;
        for w in &self.work {
            let Some(backend) = w.backend.map(|b| wg.backend(b)) else { continue };
            if w.plan.removes.is_empty() {
                continue;
            }
            cx.report.writes += 1;
            if let Err(e) = backend.apply_peers(&w.spec.name, &w.plan.removes) {
                return Err(cx.refuse(Refusal::Wireguard(e)));
            }
            cx.report.actions.extend(w.plan.removes.iter().map(|c| c.describe(&w.spec.name)));
        }
        Ok(())
    }
}

#[derive(Default)]
struct Sysctls {
    /// The current values of the desired keys.
    values: BTreeMap<String, String>,
    plan: sysctl::Plan,
}

impl Step for Sysctls {
    fn kind(&self) -> Kind {
        Kind::Sysctls
    }
    fn observe(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        // On the session's thread: /proc/sys/net is the namespace's only from a thread inside it.
        let (objects, _) = cx.rtnl()?;
        match sysctl::read_all(&objects.sysctls) {
            Ok(values) => {
                self.values = values;
                Ok(())
            }
            Err(e) => Err(cx.refuse(Refusal::Rtnl(e))),
        }
    }
    fn plan(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        self.plan = sysctl::plan(&cx.objects.sysctls, &self.values);
        Ok(())
    }
    fn differences(&self, missing: &mut Vec<String>, _: &mut Vec<String>) {
        let mut m = Vec::new();
        self.plan.missing(&mut m);
        named(m, missing);
    }
    fn make(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        let (_, s) = cx.rtnl()?;
        for (spec, _) in &self.plan.sets {
            s.record(sysctl::set(spec));
        }
        cx.settle()
    }
    fn brk(&mut self, _: &mut Cx<'_>) -> Result<(), Stopped> {
        Ok(())
    }
}

/// The nftables tables: each desired one an applier remembers applied in its own transactions
/// (only its delta, without reading the table back); the new ones created, and every other
/// table kuport owns removed, in one transaction (docs/intercept/table.md, lifecycle).
pub(crate) struct Tables<'a> {
    /// One applier per table (an apply); None in a drift check, which reads every table back.
    appliers: Option<&'a mut BTreeMap<TableId, nft::Applier>>,
    /// kuport's tables the kernel is known to hold; None: unknown, listed by the next observe.
    present: &'a mut Option<BTreeSet<TableId>>,
    /// In a drift check: what each desired table differs in, named.
    changed: Vec<String>,
    /// kuport's tables the state does not have.
    removes: Vec<TableId>,
}

impl<'a> Tables<'a> {
    /// The step of an apply.
    pub(crate) fn apply(
        appliers: &'a mut BTreeMap<TableId, nft::Applier>,
        present: &'a mut Option<BTreeSet<TableId>>,
    ) -> Self {
        Tables { appliers: Some(appliers), present, changed: Vec::new(), removes: Vec::new() }
    }

    /// The step of a drift check.
    pub(crate) fn check(present: &'a mut Option<BTreeSet<TableId>>) -> Self {
        *present = None;
        Tables { appliers: None, present, changed: Vec::new(), removes: Vec::new() }
    }

    fn read_back(&mut self, cx: &mut Cx<'_>) -> Result<(), Refusal> {
        for t in &cx.state.nft_tables {
            let nft = |error| Refusal::Nft { table: t.name.clone(), error };
            let want = nft::normalize(t).map_err(nft)?;
            let read = nft::read_table(cx.netns, family(t.family), &t.name);
            self.changed.extend(table_differences(&want, read).map_err(nft)?);
        }
        Ok(())
    }
}

/// What desired table `want` (normalized) differs in from what reading it gave, named. A rule
/// or set outside kuport's vocabulary is not the table as kuport wrote it (a hand-made change):
/// a difference, which the repair's apply rebuilds whole (as `nft::apply_table` does), not a
/// refusal that would leave it in place. Other read errors are errors.
fn table_differences(
    want: &NftTable,
    read: Result<Option<NftTable>, nft::NftError>,
) -> Result<Vec<String>, nft::NftError> {
    let diffs = match read {
        Ok(have) => nft::diff(want, have.as_ref()),
        Err(nft::NftError::Decode { what }) => vec![nft::NftDiff::Unreadable(what)],
        Err(e) => return Err(e),
    };
    Ok(diffs.iter().map(|d| format!("nft table {}: {d}", want.name)).collect())
}

impl Step for Tables<'_> {
    fn kind(&self) -> Kind {
        Kind::NftTables
    }

    fn observe(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        if self.present.is_none() {
            match nft::list_tables(cx.netns) {
                Ok(all) => {
                    let owned = all.into_iter().filter(|(_, name)| name.starts_with(owned::NFT_TABLE_PREFIX));
                    *self.present = Some(owned.map(|(f, name)| (f as i32, name)).collect());
                }
                Err(error) => return Err(cx.refuse(Refusal::Nft { table: "tables".into(), error })),
            }
        }
        if self.appliers.is_none() {
            self.changed.clear();
            if let Err(r) = self.read_back(cx) {
                return Err(cx.refuse(r));
            }
        }
        Ok(())
    }

    fn plan(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        let wanted: BTreeSet<TableId> = cx.state.nft_tables.iter().map(id).collect();
        self.removes = self.present.iter().flatten().filter(|t| !wanted.contains(*t)).cloned().collect();
        Ok(())
    }

    fn differences(&self, missing: &mut Vec<String>, extra: &mut Vec<String>) {
        missing.extend(self.changed.iter().cloned());
        extra.extend(self.removes.iter().map(|(f, name)| format!("extra nft table {} {name}", family_name(*f))));
    }

    fn make(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        if let Some(appliers) = self.appliers.as_deref_mut() {
            appliers.retain(|t, _| cx.state.nft_tables.iter().any(|d| id(d) == *t));
        }
        let fresh = self.fresh(cx);
        for t in cx.state.nft_tables.iter().filter(|t| !fresh.contains(&id(t))) {
            let result = match self.appliers.as_deref_mut() {
                Some(appliers) => appliers.entry(id(t)).or_insert_with(|| nft::Applier::new(cx.netns)).apply(t),
                None => nft::apply_table(cx.netns, t),
            };
            match result {
                Ok(r) => {
                    cx.report.writes += r.writes;
                    if r.writes > 0 {
                        cx.report.actions.push(format!(
                            "nft table {}: {:?}, {} message(s) in {} transaction(s) for {} difference(s)",
                            t.name,
                            r.mode,
                            r.writes,
                            r.batches,
                            r.diffs.len()
                        ));
                    }
                    if let Some(present) = self.present.as_mut() {
                        present.insert(id(t));
                    }
                }
                Err(error) => {
                    // Whether a refused table exists is no longer known.
                    *self.present = None;
                    return Err(cx.refuse(Refusal::Nft { table: t.name.clone(), error }));
                }
            }
        }
        // Last, so that a refusal above removes nothing.
        if !fresh.is_empty() {
            self.together(cx, &fresh)?;
        }
        Ok(())
    }

    fn brk(&mut self, cx: &mut Cx<'_>) -> Result<(), Stopped> {
        if self.removes.is_empty() {
            return Ok(());
        }
        self.together(cx, &BTreeSet::new())
    }
}

impl Tables<'_> {
    /// The desired tables the kernel is known not to hold and no applier remembers: created
    /// whole, with the removals, in one transaction ([`Self::together`]), so that a pod's
    /// `ip` and `ip6` interception tables appear in one generation (docs/intercept/table.md,
    /// lifecycle). A remembered table keeps its applier's delta.
    fn fresh(&self, cx: &Cx<'_>) -> BTreeSet<TableId> {
        let Some(present) = self.present.as_ref() else { return BTreeSet::new() };
        let remembered =
            |t: &TableId| self.appliers.as_deref().is_some_and(|a| a.get(t).is_some_and(|a| a.remembers()));
        let budget = nft::ApplyOptions::default().max_ops_per_batch;
        let fresh: BTreeSet<TableId> =
            cx.state.nft_tables.iter().map(id).filter(|t| !present.contains(t) && !remembered(t)).collect();
        let elements: usize = cx
            .state
            .nft_tables
            .iter()
            .filter(|t| fresh.contains(&id(t)))
            .flat_map(|t| &t.sets)
            .map(|s| s.elements.len())
            .sum();
        // More than one transaction holds: each table on its own, as before.
        if elements > budget { BTreeSet::new() } else { fresh }
    }

    /// Creates the desired tables `fresh` names and removes every planned removal, in one
    /// transaction.
    fn together(&mut self, cx: &mut Cx<'_>, fresh: &BTreeSet<TableId>) -> Result<(), Stopped> {
        let mut creates = Vec::new();
        for t in cx.state.nft_tables.iter().filter(|t| fresh.contains(&id(t))) {
            match nft::normalize(t) {
                Ok(want) => creates.push((t, want)),
                Err(error) => return Err(cx.refuse(Refusal::Nft { table: t.name.clone(), error })),
            }
        }
        let removes: Vec<(NftFamily, String)> = self.removes.iter().map(|(f, n)| (family(*f), n.clone())).collect();
        let wants: Vec<&NftTable> = creates.iter().map(|(_, w)| w).collect();
        let budget = nft::ApplyOptions::default().max_ops_per_batch;
        match nft::create_and_remove(cx.netns, &wants, &removes, budget) {
            Ok(Some(r)) => {
                cx.report.writes += r.writes;
                if r.writes > 0 {
                    let (made, gone) = (creates.len(), self.removes.len());
                    cx.report.actions.push(format!(
                        "nft tables: {made} created and {gone} deleted, {} message(s) in {} transaction(s)",
                        r.writes, r.batches
                    ));
                }
                cx.report.actions.extend(
                    creates.iter().map(|(t, _)| format!("nft table {} {}: created", family_name(t.family), t.name)),
                );
                cx.report
                    .actions
                    .extend(self.removes.iter().map(|(f, n)| format!("delete nft table {} {n}", family_name(*f))));
                for t in std::mem::take(&mut self.removes) {
                    if let Some(appliers) = self.appliers.as_deref_mut() {
                        appliers.remove(&t);
                    }
                    if let Some(present) = self.present.as_mut() {
                        present.remove(&t);
                    }
                }
                for (t, want) in creates {
                    if let Some(appliers) = self.appliers.as_deref_mut() {
                        appliers.entry(id(t)).or_insert_with(|| nft::Applier::new(cx.netns)).created(want, t);
                    }
                    if let Some(present) = self.present.as_mut() {
                        present.insert(id(t));
                    }
                }
                Ok(())
            }
            Ok(None) => {
                // fresh() keeps within one transaction's budget, so this is not reached.
                let error = nft::NftError::Invalid {
                    object: "transaction".into(),
                    reason: format!("more than {budget} elements for one transaction"),
                };
                Err(cx.refuse(Refusal::Nft { table: "tables".into(), error }))
            }
            Err(error) => {
                *self.present = None;
                let mut names: Vec<String> = creates.iter().map(|(t, _)| t.name.clone()).collect();
                names.extend(self.removes.iter().map(|(_, n)| n.clone()));
                names.dedup();
                Err(cx.refuse(Refusal::Nft { table: names.join(", "), error }))
            }
        }
    }
}

fn id(t: &NftTable) -> TableId {
    (t.family, t.name.clone())
}

fn family(f: i32) -> NftFamily {
    NftFamily::try_from(f).unwrap_or(NftFamily::Unspecified)
}

/// The family as `nft` names it.
fn family_name(f: i32) -> &'static str {
    match family(f) {
        NftFamily::Ip => "ip",
        NftFamily::Ip6 => "ip6",
        NftFamily::Inet => "inet",
        NftFamily::Unspecified => "unspecified",
    }
}

fn rtnl_error(e: rtnl::Error) -> ObjectError {
    let (object, reason) = match e {
        rtnl::Error::Kernel { op, object, reason, .. } => (format!("{op} {object}"), reason),
        rtnl::Error::Invalid { object, reason } => (object, format!("invalid: {reason}")),
        rtnl::Error::NoDevice { object, dev } => (object, format!("device {dev} does not exist")),
        rtnl::Error::Sysctl { key, source } => (format!("sysctl {key}"), source.to_string()),
        rtnl::Error::Netns { path, source } => (format!("network namespace {}", path.display()), source.to_string()),
        rtnl::Error::Io { what, source } => (what.to_string(), source.to_string()),
    };
    ObjectError { object, reason }
}

fn wireguard_error(e: wireguard::Error) -> ObjectError {
    match e {
        wireguard::Error::Invalid { object, reason } => ObjectError { object, reason: format!("invalid: {reason}") },
        wireguard::Error::Device { device, op, reason } => {
            ObjectError { object: format!("wireguard device {device}: {op}"), reason }
        }
        e @ (wireguard::Error::Unsupported { .. } | wireguard::Error::NoKey { .. }) => {
            ObjectError { object: "wireguard".into(), reason: e.to_string() }
        }
    }
}

fn nft_error(table: &str, e: nft::NftError) -> ObjectError {
    match e {
        nft::NftError::Kernel { object, reason, .. } => {
            ObjectError { object: format!("nft table {table}: {object}"), reason }
        }
        nft::NftError::Invalid { object, reason } => {
            ObjectError { object: format!("nft table {table}: {object}"), reason: format!("invalid: {reason}") }
        }
        other => ObjectError { object: format!("nft table {table}"), reason: other.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_of_an_apply_run_in_order() {
        let mut present = None;
        let mut tables = Tables::check(&mut present);
        let mut objects = Objects::default();
        let kinds: Vec<Kind> = objects.with(Some(&mut tables)).iter().map(|s| s.kind()).collect();
        assert_eq!(kinds, ORDER);
    }

    /// A drift check that meets a rule it does not understand (a hand-made change) reports a
    /// difference, so the repair rebuilds the table, instead of refusing and leaving it.
    #[test]
    fn a_table_that_does_not_decode_is_a_difference_not_a_refusal() {
        use kuport_proto::build::{accept, base_chain, rule, table};
        use kuport_proto::v1::{ChainPolicy, ChainType, Hook};
        let chain = base_chain(
            "forward",
            ChainType::Filter,
            Hook::Forward,
            0,
            ChainPolicy::Accept,
            vec![rule(vec![], vec![accept()])],
        );
        let want = nft::normalize(&table(NftFamily::Inet, "kuport-overlay", vec![], vec![chain])).expect("normalize");
        let decode = Err(nft::NftError::Decode { what: "expression log is outside kuport's vocabulary".into() });
        let found = table_differences(&want, decode).expect("a difference, not an error");
        assert_eq!(
            found,
            vec!["nft table kuport-overlay: table unreadable: expression log is outside kuport's vocabulary"]
        );
        assert_eq!(table_differences(&want, Ok(Some(want.clone()))).expect("read"), Vec::<String>::new());
        assert_eq!(table_differences(&want, Ok(None)).expect("read").len(), 1, "a missing table differs");
        let io = nft::NftError::Io { op: "dump", source: std::io::Error::other("gone") };
        assert!(table_differences(&want, Err(io)).is_err(), "other errors still refuse");
    }
}
