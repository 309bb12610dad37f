//! The executor: makes one network namespace match its desired [`NetnsState`], keeps it so, and
//! notices outside changes.
//!
//! - [`steps`]: one apply as ordered steps, one per kind of object (links, WireGuard devices,
//!   sysctls, addresses, neighbours, routes, rules, nftables tables), make before break: everything the new state adds or
//!   changes goes in while what it drops is kept; then what is no longer desired goes, in
//!   reverse order. The link, address, route, rule and sysctl steps are skipped when the new
//!   state's objects of those kinds equal those last applied and no drift was found since (a
//!   one-mapping change is then only its table delta); the drift check, not the next apply,
//!   finds and repairs outside changes.
//! - `drift`: the check and the keep loop (change notifications, debounce, retries).
//! - `keeper`: an executor on a thread of its own, fed states over a channel.
//! - `dropper`: large replaced states freed off the apply's path.
//!
//! A refusal stops the apply where it is: what already works is never torn down for something
//! new that failed, and nothing is torn down on drop or shutdown either.

mod drift;
mod dropper;
mod keeper;
pub mod steps;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use kuport_proto::v1::{NetnsState, NftTable};

pub use drift::{BACKSTOP, DEBOUNCE, RETRY_FIRST, WIREGUARD_POLL};
pub(crate) use dropper::drop_elsewhere;
pub use keeper::{Command, Keeper, spawn_keeper, spawn_keeper_held};
use steps::{Cx, Objects, Refusal, TableId, Tables};

use crate::podns::Held;
use crate::wireguard::Wireguard;
use crate::{conntrack, nft, rtnl};

/// One object the kernel (or validation) refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectError {
    /// The object, named the way `ip` or `nft` would: `add route default via ... table 201`.
    pub object: String,
    /// The kernel's reason (errno text and extended-ack message), or the validation's.
    pub reason: String,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.object, self.reason)
    }
}

/// What one apply did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Writes sent to the kernel (netlink messages and sysctl writes), refused ones included.
    pub writes: usize,
    /// What was written, in order.
    pub actions: Vec<String>,
    /// The refusals; empty on success.
    pub errors: Vec<ObjectError>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} write(s)", self.writes)?;
        for a in &self.actions {
            write!(f, "\n  {a}")?;
        }
        for e in &self.errors {
            write!(f, "\n  refused: {e}")?;
        }
        Ok(())
    }
}

fn join(errors: &[ObjectError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Part of the state was refused; the namespace keeps what it had for that part.
    #[error("refused after {} write(s): {}", report.writes, join(&report.errors))]
    Refused { report: Report },
    /// The kernel's state could not be read (for a drift check).
    #[error("reading {what}: {reason}")]
    Read { what: String, reason: String },
    /// A change subscription could not be made or ended.
    #[error("watching {what}: {reason}")]
    Watch { what: &'static str, reason: String },
    /// The namespace kept by reference can no longer be reached (its pod or file is gone).
    #[error("network namespace {what} is gone")]
    Gone { what: String },
}

/// What the executor has done so far; shared with whoever reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Applies attempted (the first one, updates, repairs).
    pub applies: u64,
    /// Drift episodes: each outside change found (and repaired) counts once, however many
    /// checks and repair attempts it takes.
    pub drift_repairs: u64,
    /// The differences of the last drift found, named.
    pub last_differences: Vec<String>,
    /// The last failure (apply or check), None once an apply succeeds again.
    pub last_error: Option<String>,
}

/// A handle to an executor's [`Stats`], readable from any thread.
#[derive(Debug, Clone, Default)]
pub struct StatsHandle(Arc<Mutex<Stats>>);

impl StatsHandle {
    pub fn get(&self) -> Stats {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Stats> {
        // Stats stay meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Applies and keeps the desired state of one network namespace.
#[derive(Debug)]
pub struct Executor {
    /// None: the caller's namespace.
    netns: Option<PathBuf>,
    /// A namespace kept by reference, held open for the executor's life (`netns` names the
    /// open file, so it cannot come to mean another namespace).
    held: Option<Held>,
    /// The state last asked for: what the drift loop keeps (shared, not copied: at 50,000
    /// mappings a copy of its tables costs milliseconds).
    desired: Option<Arc<NetnsState>>,
    /// The links, addresses, routes, rules and sysctls of the state last applied in full (its
    /// nft tables left out).
    applied: Option<NetnsState>,
    /// Whether the kernel is known to hold `applied`'s objects: set by a full apply, cleared
    /// when one starts (until it succeeds) and when drift is found. While it holds, a state with
    /// the same objects skips their steps (a thread, a netlink runtime and a dump of every
    /// link, address, route and rule: 0.6 ms, up to 13 ms on the benchmark machine).
    objects_known: bool,
    /// Inside a drift episode (found, not yet repaired).
    drifting: bool,
    /// One applier per table: it remembers what it applied, so a change sends only the delta
    /// without reading the table back. Forgotten whenever drift is found.
    tables: BTreeMap<TableId, nft::Applier>,
    /// kuport's tables the kernel is known to hold (None: unknown, listed by the next apply).
    tables_present: Option<BTreeSet<TableId>>,
    /// The node's WireGuard key and backends: states with WireGuard devices are refused
    /// without it.
    wireguard: Option<Arc<Wireguard>>,
    stats: StatsHandle,
}

impl Executor {
    pub fn new(netns: Option<PathBuf>) -> Self {
        let netns = netns.filter(|p| !p.as_os_str().is_empty());
        Executor {
            netns,
            held: None,
            desired: None,
            applied: None,
            objects_known: false,
            drifting: false,
            tables: BTreeMap::new(),
            tables_present: None,
            wireguard: crate::wireguard::installed(),
            stats: StatsHandle::default(),
        }
    }

    /// Programs WireGuard devices with `wg`'s key and backends (instead of the one
    /// [`crate::wireguard::install`] set, if any).
    pub fn with_wireguard(mut self, wg: Arc<Wireguard>) -> Self {
        self.wireguard = Some(wg);
        self
    }

    /// An executor for a namespace held open (see [`Held`]): it works through the open file
    /// and its keep loop ends once the namespace can no longer be reached.
    pub fn held(held: Held) -> Self {
        let mut ex = Executor::new(Some(held.path()));
        ex.held = Some(held);
        ex
    }

    pub fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Makes the namespace match `desired` (see the module's order). Applying the state the
    /// namespace already has writes nothing. Keeps a copy of `desired`; a caller that holds it
    /// in an [`Arc`] saves that copy with [`Executor::apply_shared`].
    pub fn apply(&mut self, desired: &NetnsState) -> Result<Report, ExecError> {
        self.apply_shared(Arc::new(desired.clone()))
    }

    /// [`Executor::apply`] of a shared state, which is kept without copying it.
    pub fn apply_shared(&mut self, desired: Arc<NetnsState>) -> Result<Report, ExecError> {
        let started = std::time::Instant::now();
        let old = self.desired.replace(Arc::clone(&desired));
        let mut result = self.apply_inner(&desired);
        let applied = started.elapsed();
        if let (Ok(report), Some(old)) = (&mut result, &old)
            && !Arc::ptr_eq(old, &desired)
        {
            self.delete_stale_flows(old, &desired, report);
        }
        let flows = started.elapsed() - applied;
        if let Some(old) = old {
            dropper::drop_elsewhere(old);
        }
        // Where the time goes (the apply benchmark's KUPORT_BENCH_TRACE=1 prints it).
        tracing::debug!(?applied, ?flows, total = ?started.elapsed(), "state applied");
        let mut stats = self.stats.lock();
        stats.applies += 1;
        stats.last_error = result.as_ref().err().map(ToString::to_string);
        result
    }

    fn apply_inner(&mut self, desired: &NetnsState) -> Result<Report, ExecError> {
        let netns = self.netns.as_deref();
        let same_objects = self.objects_known && self.applied.as_ref().is_some_and(|a| same_objects(a, desired));
        let mut tables = Tables::apply(&mut self.tables, &mut self.tables_present);
        let (report, refusals) = if same_objects {
            // Only the tables: no thread, no netlink runtime, no dump.
            let none = rtnl::Desired::default();
            let mut cx = Cx::new(netns, desired, &none);
            let _ = steps::make_then_break(&mut [&mut tables], &mut cx);
            (cx.report, cx.refusals)
        } else {
            self.objects_known = false;
            let objects =
                rtnl::Desired::from_proto(desired).map_err(|e| refused(Report::default(), vec![Refusal::Rtnl(e)]))?;
            let wg = self.wireguard.as_deref();
            let outcome = rtnl::session(netns, |s| {
                let mut cx = Cx::new(netns, desired, &objects);
                cx.rtnl = Some(s);
                cx.wg = wg;
                let mut objects = Objects::default();
                let _ = steps::make_then_break(&mut objects.with(Some(&mut tables)), &mut cx);
                (cx.report, cx.refusals)
            });
            outcome.map_err(|e| refused(Report::default(), vec![Refusal::Rtnl(e)]))?
        };
        if !refusals.is_empty() {
            return Err(refused(report, refusals));
        }
        if !same_objects {
            self.applied = Some(without_tables(desired));
            self.objects_known = true;
        }
        Ok(report)
    }

    /// Once the new tables are in, deletes the conntrack entries of UDP flows a DNAT element
    /// no longer translates, or a new one would, and those a new request claim would keep from
    /// the CNI's masquerade (see [`conntrack::stale_udp`]), in every table of the old or the new
    /// state: their next datagram meets the new elements. `old` is the
    /// state asked for before; a failure here is logged and reported, never an apply error,
    /// since the datapath itself is right.
    fn delete_stale_flows(&self, old: &NetnsState, new: &NetnsState, report: &mut Report) {
        let mut flows = Vec::new();
        for (family, name) in table_ids(old, new) {
            flows.extend(conntrack::stale_udp(table(old, family, name), table(new, family, name)));
        }
        if flows.is_empty() {
            return;
        }
        match conntrack::delete_stale(self.netns.as_deref(), &flows) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(netns = ?self.netns, deleted = n, "conntrack entries of UDP flows on a stale path deleted");
                report.writes += n;
                report.actions.push(format!("delete {n} conntrack entries of UDP flows on a stale path"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "deleting stale UDP conntrack entries");
                report.actions.push(format!("conntrack cleanup failed: {e}"));
            }
        }
    }

    /// The named differences between `desired` and the kernel; empty when it matches.
    pub fn differences(&self, desired: &NetnsState) -> Result<Vec<String>, ExecError> {
        let netns = self.netns.as_deref();
        let read = |what: &str, reason: String| ExecError::Read { what: what.to_string(), reason };
        let objects = rtnl::Desired::from_proto(desired).map_err(|e| read("desired state", e.to_string()))?;
        let wg = self.wireguard.as_deref();
        let outcome = rtnl::session(netns, |s| {
            let mut cx = Cx::new(netns, desired, &objects);
            cx.rtnl = Some(s);
            cx.wg = wg;
            let mut present = None;
            let mut tables = Tables::check(&mut present);
            let mut objects = Objects::default();
            let found = steps::differences(&mut objects.with(Some(&mut tables)), &mut cx);
            (found, cx.refusals)
        });
        let (found, refusals) = outcome.map_err(|e| read("links, addresses, routes and rules", e.to_string()))?;
        match found {
            Ok(found) => Ok(found),
            Err(_) => {
                let errors: Vec<ObjectError> = refusals.into_iter().map(Refusal::object_error).collect();
                Err(read("the kernel's state", join(&errors)))
            }
        }
    }
}

impl Executor {
    /// Whether the namespace's WireGuard devices differ from `desired`'s (a cheap check of that
    /// step alone: WireGuard announces no change of its peers, so the keep loop polls it).
    fn wireguard_drift(&self, desired: &NetnsState) -> bool {
        if desired.wireguard_devices.is_empty() {
            return false;
        }
        let netns = self.netns.as_deref();
        let Ok(objects) = rtnl::Desired::from_proto(desired) else { return false };
        let wg = self.wireguard.as_deref();
        let outcome = rtnl::session(netns, |s| {
            let mut cx = Cx::new(netns, desired, &objects);
            cx.rtnl = Some(s);
            cx.wg = wg;
            let mut step = steps::WireguardStep::default();
            steps::differences(&mut [&mut step], &mut cx).map(|d| !d.is_empty())
        });
        // A failed read counts as drift: the full check then names it.
        !matches!(outcome, Ok(Ok(false)))
    }
}

fn refused(mut report: Report, refusals: Vec<Refusal>) -> ExecError {
    report.errors.extend(refusals.into_iter().map(Refusal::object_error));
    ExecError::Refused { report }
}

/// Every table's identity in `a` or `b`, once.
fn table_ids<'s>(a: &'s NetnsState, b: &'s NetnsState) -> BTreeSet<(i32, &'s str)> {
    a.nft_tables.iter().chain(&b.nft_tables).map(|t| (t.family, t.name.as_str())).collect()
}

fn table<'s>(state: &'s NetnsState, family: i32, name: &str) -> Option<&'s NftTable> {
    state.nft_tables.iter().find(|t| t.family == family && t.name == name)
}

/// `state` without its nft tables: what the object steps' skip compares.
fn without_tables(state: &NetnsState) -> NetnsState {
    NetnsState {
        target: state.target.clone(),
        version: String::new(),
        held: false,
        sysctls: state.sysctls.clone(),
        nft_tables: Default::default(),
        links: state.links.clone(),
        addresses: state.addresses.clone(),
        routes: state.routes.clone(),
        ip_rules: state.ip_rules.clone(),
        neighbours: state.neighbours.clone(),
        wireguard_devices: state.wireguard_devices.clone(),
        delta: None,
    }
}

/// Whether two states hold the same links, WireGuard devices, addresses, routes, rules and
/// sysctls (their nft tables are not compared). Destructured without `..`, so a new kind of
/// object does not compile until it is compared here.
fn same_objects(a: &NetnsState, b: &NetnsState) -> bool {
    let NetnsState {
        target,
        version: _,
        held: _,
        sysctls,
        nft_tables: _,
        links,
        addresses,
        routes,
        ip_rules,
        neighbours,
        wireguard_devices,
        // Resolved before an apply (sync's `resolve_deltas`): never in a state applied.
        delta: _,
    } = a;
    (target, sysctls, links, addresses, neighbours, routes, ip_rules, wireguard_devices)
        == (&b.target, &b.sysctls, &b.links, &b.addresses, &b.neighbours, &b.routes, &b.ip_rules, &b.wireguard_devices)
}
