//! The executor: makes one network namespace match its desired [`NetnsState`] (links, addresses,
//! routes, rules, sysctls through [`route`]; nftables through [`nft`]), keeps it so, and
//! notices outside changes.
//!
//! Order of one apply (make before break):
//! 1. links, addresses, routes, rules and sysctls the new state adds or changes, while every
//!    object of the previously applied state that the new one drops is still kept;
//! 2. the nftables tables (each one transaction), or the removal of kuport's table when the
//!    state has none;
//! 3. only then the removal of the links, addresses, routes and rules no longer desired.
//!
//! Steps 1 and 3 are skipped when the new state's links, addresses, routes, rules and sysctls
//! equal those last applied and no drift was found since (a one-mapping change is then only
//! its table delta); the drift check, not the next apply, finds and repairs outside changes.
//!
//! A refusal stops the apply where it is: what already works is never torn down for something
//! new that failed, and nothing is torn down on drop or shutdown either.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kuport_proto::owned;
use kuport_proto::v1::{NetnsState, NftFamily};
use tokio::sync::{mpsc, oneshot};

use crate::{conntrack, nft, route};

/// How long a burst of change notifications is collected before one check: a deleted link
/// takes its addresses and routes with it, each announced on its own.
pub const DEBOUNCE: Duration = Duration::from_millis(50);
/// How often the kernel is checked without any notification (a lost or missed event).
pub const BACKSTOP: Duration = Duration::from_secs(30);
/// The first retry after a failed apply or repair; later ones double up to [`BACKSTOP`].
pub const RETRY_FIRST: Duration = Duration::from_millis(250);

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
    /// The state last asked for: what the drift loop keeps (shared, not copied: at 50,000
    /// mappings a copy of its tables costs milliseconds).
    desired: Option<Arc<NetnsState>>,
    /// The links, addresses, routes, rules and sysctls of the state last applied in full (its
    /// nft tables left out): they stay until a new state's tables are in.
    applied: Option<NetnsState>,
    /// Whether the kernel is known to hold `applied`'s objects: set by a full apply, cleared
    /// when a route step starts (until it succeeds) and when drift is found. While it holds, a
    /// state with the same objects skips the route step (a thread, a netlink runtime and a dump
    /// of every link, address, route and rule: 0.6 ms, up to 13 ms on the benchmark machine).
    routes_known: bool,
    /// Inside a drift episode (found, not yet repaired).
    drifting: bool,
    /// One applier per table: it remembers what it applied, so a change sends only the delta
    /// without reading the table back. Forgotten whenever drift is found.
    tables: BTreeMap<(i32, String), nft::Applier>,
    stats: StatsHandle,
}

impl Executor {
    pub fn new(netns: Option<PathBuf>) -> Self {
        let netns = netns.filter(|p| !p.as_os_str().is_empty());
        Executor {
            netns,
            desired: None,
            applied: None,
            routes_known: false,
            drifting: false,
            tables: BTreeMap::new(),
            stats: StatsHandle::default(),
        }
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
            drop_elsewhere(old);
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
        let mut report = Report::default();

        // 1. Make: the new objects, with the old ones still in place.
        let started = std::time::Instant::now();
        let same_routes = self.routes_known && self.applied.as_ref().is_some_and(|a| same_objects(a, desired));
        let mut before = None;
        if !same_routes {
            self.routes_known = false;
            before = self.applied.as_ref().map(|prev| keep_previous(desired, prev));
            // A merge the route model refuses (e.g. two states' objects clash) is skipped: the
            // desired state alone is then applied in one step.
            before = before.filter(|b| route::Desired::from_proto(b).is_ok());
            route_step(netns, before.as_ref().unwrap_or(desired), &mut report)?;
        }
        let routes = started.elapsed();

        // 2. The tables: each is one transaction, so a refusal leaves the old table whole.
        let mut own_table = false;
        for t in &desired.nft_tables {
            own_table |= t.family == NftFamily::Ip as i32 && t.name == owned::NFT_TABLE;
            let applier = self.tables.entry((t.family, t.name.clone())).or_insert_with(|| nft::Applier::new(netns));
            match applier.apply(t) {
                Ok(r) => {
                    report.writes += r.writes;
                    if r.writes > 0 {
                        report.actions.push(format!(
                            "nft table {}: {:?}, {} message(s) in {} transaction(s) for {} difference(s)",
                            t.name,
                            r.mode,
                            r.writes,
                            r.batches,
                            r.diffs.len()
                        ));
                    }
                }
                Err(e) => {
                    report.errors.push(nft_error(&t.name, e));
                    return Err(ExecError::Refused { report });
                }
            }
        }
        if !own_table {
            self.tables.remove(&(NftFamily::Ip as i32, owned::NFT_TABLE.to_string()));
            match nft::remove_table(netns, NftFamily::Ip, owned::NFT_TABLE) {
                Ok(true) => {
                    // One transaction of two messages: add (so the delete is valid) and delete.
                    report.writes += 2;
                    report.actions.push(format!("delete nft table ip {}", owned::NFT_TABLE));
                }
                Ok(false) => {}
                Err(e) => {
                    report.errors.push(nft_error(owned::NFT_TABLE, e));
                    return Err(ExecError::Refused { report });
                }
            }
        }

        let tables = started.elapsed() - routes;
        tracing::debug!(?routes, ?tables, same_routes, "make and tables");
        // 3. Break: what the new state no longer has.
        if before.as_ref().is_some_and(|b| !same_objects(b, desired)) {
            route_step(netns, desired, &mut report)?;
        }
        if !same_routes {
            self.applied = Some(without_tables(desired));
            self.routes_known = true;
        }
        Ok(report)
    }

    /// Once the new table is in, deletes the conntrack entries of UDP flows a DNAT element no
    /// longer translates, or a new one would (see [`conntrack::stale_udp`]): their next
    /// datagram meets the new element. `old` is the state asked for before; a failure here is logged and reported,
    /// never an apply error, since the datapath itself is right.
    fn delete_stale_flows(&self, old: &NetnsState, new: &NetnsState, report: &mut Report) {
        let flows = conntrack::stale_udp(own_table(old), own_table(new));
        if flows.is_empty() {
            return;
        }
        match conntrack::delete_stale(self.netns.as_deref(), &flows) {
            Ok(0) => {}
            Ok(n) => {
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
        let model = route::Desired::from_proto(desired).map_err(|e| read("desired state", e.to_string()))?;
        let observed =
            route::read(netns, &model).map_err(|e| read("links, addresses, routes and rules", e.to_string()))?;
        let mut out: Vec<String> = route::diff(&model, &observed).iter().map(ToString::to_string).collect();
        let mut own_table = false;
        for t in &desired.nft_tables {
            own_table |= t.family == NftFamily::Ip as i32 && t.name == owned::NFT_TABLE;
            let want = nft::normalize(t).map_err(|e| read("desired nft table", e.to_string()))?;
            let family = NftFamily::try_from(t.family).unwrap_or(NftFamily::Unspecified);
            let have = nft::read_table(netns, family, &t.name).map_err(|e| read("nft table", e.to_string()))?;
            out.extend(nft::diff(&want, have.as_ref()).iter().map(|d| format!("nft table {}: {d}", t.name)));
        }
        if !own_table
            && nft::read_table(netns, NftFamily::Ip, owned::NFT_TABLE)
                .map_err(|e| read("nft table", e.to_string()))?
                .is_some()
        {
            out.push(format!("extra nft table ip {}", owned::NFT_TABLE));
        }
        Ok(out)
    }

    /// One drift check: when the kernel differs from the desired state, re-applies it. Returns
    /// the differences found (empty: nothing to do, which is also what our own writes cause).
    pub fn check(&mut self) -> Vec<String> {
        let Some(desired) = self.desired.clone() else { return Vec::new() };
        let found = match self.differences(&desired) {
            Ok(d) => d,
            Err(e) => {
                self.stats.lock().last_error = Some(e.to_string());
                return Vec::new();
            }
        };
        if found.is_empty() {
            self.drifting = false;
            return found;
        }
        {
            let mut stats = self.stats.lock();
            if !self.drifting {
                stats.drift_repairs += 1;
            }
            stats.last_differences = found.clone();
        }
        self.drifting = true;
        // The kernel changed under the appliers: the repair must start from what it holds.
        for applier in self.tables.values_mut() {
            applier.forget();
        }
        self.routes_known = false;
        if self.apply_shared(desired).is_ok() {
            self.drifting = false;
        }
        found
    }

    /// Applies `desired`, then keeps it until `stop` completes: waits for link, address,
    /// route, rule and nftables change notifications (or the [`BACKSTOP`] timer), collects a
    /// burst for [`DEBOUNCE`], then [`Executor::check`]s. A failed apply is recorded in the
    /// stats and retried at the next check. Never tears anything down on exit.
    pub async fn keep<F: Future<Output = ()>>(&mut self, desired: &NetnsState, stop: F) -> Result<(), ExecError> {
        let (_commands, rx) = mpsc::channel(1);
        self.keep_loop(Some(desired), rx, stop).await
    }

    /// Like [`Executor::keep`], but the state to keep arrives as [`Command`]s (each answered
    /// with its apply's result); ends when every sender is dropped.
    pub async fn serve(&mut self, commands: mpsc::Receiver<Command>) -> Result<(), ExecError> {
        self.keep_loop(None, commands, std::future::pending()).await
    }

    async fn keep_loop<F: Future<Output = ()>>(
        &mut self,
        initial: Option<&NetnsState>,
        mut commands: mpsc::Receiver<Command>,
        stop: F,
    ) -> Result<(), ExecError> {
        // Subscribe first, so that no change after the apply goes unnoticed.
        let mut links = route::subscribe(self.netns.as_deref())
            .map_err(|e| ExecError::Watch { what: "rtnetlink", reason: e.to_string() })?;
        let mut tables = nft::watch::subscribe(self.netns.as_deref())
            .map_err(|e| ExecError::Watch { what: "nftables", reason: e.to_string() })?;
        if let Some(desired) = initial {
            // Failures are in the stats; the next check retries.
            let _ = self.apply(desired);
        }
        let mut backstop = tokio::time::interval(BACKSTOP);
        backstop.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        backstop.tick().await;
        let mut open = true;
        // A failed apply or repair is tried again after RETRY_FIRST, doubling up to BACKSTOP,
        // rather than waiting for the next notification (a transient refusal under load).
        let mut retry_after = RETRY_FIRST;
        let mut retry = self.stats.get().last_error.is_some().then(|| tokio::time::Instant::now() + retry_after);
        tokio::pin!(stop);
        loop {
            let retry_due = async {
                match retry {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = retry_due => {}
                c = commands.recv(), if open => match c {
                    Some(Command::Apply(state, reply)) => {
                        let result = self.apply_shared(state);
                        // Our own writes are not drift.
                        links.drain();
                        tables.drain();
                        retry_after = RETRY_FIRST;
                        retry = result.is_err().then(|| tokio::time::Instant::now() + retry_after);
                        let _ = reply.send(result);
                        continue;
                    }
                    None if initial.is_none() => return Ok(()),
                    None => open = false,
                },
                n = links.recv() => if n.is_none() {
                    return Err(ExecError::Watch { what: "rtnetlink", reason: "subscription ended".into() });
                },
                n = tables.recv() => if n.is_none() {
                    return Err(ExecError::Watch { what: "nftables", reason: "subscription ended".into() });
                },
                _ = backstop.tick() => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
            links.drain();
            tables.drain();
            self.check();
            // What the repair itself caused is checked by the next round, and finds nothing.
            if self.drifting || self.stats.get().last_error.is_some() {
                retry = Some(tokio::time::Instant::now() + retry_after);
                retry_after = (retry_after * 2).min(BACKSTOP);
            } else {
                retry = None;
                retry_after = RETRY_FIRST;
            }
        }
    }
}

/// A request to an executor run by [`Executor::serve`] or [`spawn_keeper`].
#[derive(Debug)]
pub enum Command {
    /// Make this the state to keep, and answer with the apply's result.
    Apply(Arc<NetnsState>, oneshot::Sender<Result<Report, ExecError>>),
}

/// An executor kept on its own thread (applies block on netlink; a 50,000-mapping cold apply
/// takes seconds, which must not stall anyone's runtime).
#[derive(Debug, Clone)]
pub struct Keeper {
    commands: mpsc::Sender<Command>,
    stats: StatsHandle,
}

impl Keeper {
    /// Makes `state` the state to keep; resolves once it was applied (or refused).
    pub async fn apply(&self, state: Arc<NetnsState>) -> Result<Report, ExecError> {
        let gone = || ExecError::Watch {
            what: "executor",
            reason: self.stats.get().last_error.unwrap_or_else(|| "its thread ended".into()),
        };
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Apply(state, reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }
}

/// Starts an executor for `netns` on a thread of its own; it keeps whatever it was last asked
/// to apply until every [`Keeper`] clone is dropped, and tears nothing down then either.
pub fn spawn_keeper(netns: Option<PathBuf>) -> Result<Keeper, ExecError> {
    let mut ex = Executor::new(netns);
    let stats = ex.stats();
    let (commands, rx) = mpsc::channel(4);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ExecError::Watch { what: "executor runtime", reason: e.to_string() })?;
    let st = stats.clone();
    std::thread::Builder::new()
        .name("kuport-keeper".into())
        .spawn(move || {
            if let Err(e) = rt.block_on(ex.serve(rx)) {
                st.lock().last_error = Some(e.to_string());
            }
        })
        .map_err(|e| ExecError::Watch { what: "executor thread", reason: e.to_string() })?;
    Ok(Keeper { commands, stats })
}

/// States holding at least this many nft elements are freed by [`drop_elsewhere`]'s thread.
const DROP_ELSEWHERE: usize = 10_000;

/// Frees `state` on a thread of its own when this is its last reference and it is large:
/// freeing a 50,000-mapping state (about a million allocations) took 13 to 71 ms on the
/// benchmark machine (docs/performance.md), which the apply that replaces it need not wait for.
fn drop_elsewhere(state: Arc<NetnsState>) {
    static DROPPER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Arc<NetnsState>>>> = std::sync::OnceLock::new();
    let elements: usize = state.nft_tables.iter().flat_map(|t| &t.sets).map(|s| s.elements.len()).sum();
    if elements < DROP_ELSEWHERE || Arc::strong_count(&state) > 1 {
        return;
    }
    let dropper = DROPPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Arc<NetnsState>>();
        let thread = std::thread::Builder::new().name("kuport-dropper".into());
        let free = |state: Arc<NetnsState>| {
            let t = std::time::Instant::now();
            drop(state);
            let freed = t.elapsed();
            tracing::debug!(?freed, "dropper");
        };
        thread.spawn(move || rx.into_iter().for_each(free)).ok().map(|_| tx)
    });
    if let Some(tx) = dropper {
        // Fails only when the thread is gone; the state is then freed here.
        let _ = tx.send(state);
    }
}

/// kuport's own table in `state`, if it has one.
fn own_table(state: &NetnsState) -> Option<&kuport_proto::v1::NftTable> {
    state.nft_tables.iter().find(|t| t.family == NftFamily::Ip as i32 && t.name == owned::NFT_TABLE)
}

/// `state` without its nft tables: what the route step and [`keep_previous`] need.
fn without_tables(state: &NetnsState) -> NetnsState {
    NetnsState {
        path: state.path.clone(),
        sysctls: state.sysctls.clone(),
        nft_tables: Vec::new(),
        links: state.links.clone(),
        addresses: state.addresses.clone(),
        routes: state.routes.clone(),
        ip_rules: state.ip_rules.clone(),
    }
}

/// Whether two states hold the same links, addresses, routes, rules and sysctls (their nft
/// tables are not compared).
fn same_objects(a: &NetnsState, b: &NetnsState) -> bool {
    (&a.path, &a.sysctls, &a.links, &a.addresses, &a.routes, &a.ip_rules)
        == (&b.path, &b.sysctls, &b.links, &b.addresses, &b.routes, &b.ip_rules)
}

/// `desired` (without its nft tables) plus every link, address, route, rule and sysctl of
/// `prev` that `desired` does not replace: the state to hold while the new tables go in.
fn keep_previous(desired: &NetnsState, prev: &NetnsState) -> NetnsState {
    let mut s = without_tables(desired);
    let dropped_links: Vec<&str> = prev
        .links
        .iter()
        .filter(|l| !desired.links.iter().any(|d| d.name == l.name))
        .map(|l| l.name.as_str())
        .collect();
    s.links.extend(prev.links.iter().filter(|l| dropped_links.contains(&l.name.as_str())).cloned());
    s.addresses.extend(
        prev.addresses
            .iter()
            .filter(|a| dropped_links.contains(&a.dev.as_str()) && !desired.addresses.contains(a))
            .cloned(),
    );
    s.routes.extend(
        prev.routes.iter().filter(|r| !desired.routes.iter().any(|d| (d.table, &d.dst) == (r.table, &r.dst))).cloned(),
    );
    s.ip_rules.extend(
        prev.ip_rules
            .iter()
            .filter(|r| !desired.ip_rules.iter().any(|d| (d.pref, d.fwmark, &d.to) == (r.pref, r.fwmark, &r.to)))
            .cloned(),
    );
    s.sysctls.extend(prev.sysctls.iter().filter(|p| !desired.sysctls.iter().any(|d| d.key == p.key)).cloned());
    s
}

/// One route::apply, folded into `report`; Err once anything was refused.
fn route_step(netns: Option<&Path>, state: &NetnsState, report: &mut Report) -> Result<(), ExecError> {
    match route::apply(netns, state) {
        Ok(r) => {
            report.writes += r.writes;
            report.actions.extend(r.actions);
            Ok(())
        }
        Err(e) => {
            report.writes += e.report.writes;
            report.actions.extend(e.report.actions);
            report.errors.extend(e.errors.into_iter().map(route_error));
            Err(ExecError::Refused { report: std::mem::take(report) })
        }
    }
}

fn route_error(e: route::Error) -> ObjectError {
    let (object, reason) = match e {
        route::Error::Kernel { op, object, reason, .. } => (format!("{op} {object}"), reason),
        route::Error::Invalid { object, reason } => (object, format!("invalid: {reason}")),
        route::Error::NoDevice { object, dev } => (object, format!("device {dev} does not exist")),
        route::Error::Sysctl { key, source } => (format!("sysctl {key}"), source.to_string()),
        route::Error::Netns { path, source } => (format!("network namespace {}", path.display()), source.to_string()),
        route::Error::Io { what, source } => (what.to_string(), source.to_string()),
    };
    ObjectError { object, reason }
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
    use kuport_proto::v1::{Address, IpRule, Link, Route};

    fn link(name: &str) -> Link {
        Link { name: name.into(), mtu: 1370, kind: None }
    }

    #[test]
    fn keeps_what_the_new_state_drops_until_the_tables_are_in() {
        let prev = NetnsState {
            links: vec![link("kup-a"), link("kup-b")],
            addresses: vec![
                Address { dev: "kup-a".into(), cidr: "169.254.77.2/31".into() },
                Address { dev: "kup-b".into(), cidr: "169.254.77.4/31".into() },
            ],
            routes: vec![Route { table: 201, dst: "default".into(), via: "169.254.77.3".into(), dev: "kup-a".into() }],
            ip_rules: vec![IpRule { pref: 102, fwmark: 1, fwmask: 1, to: String::new(), table: 201 }],
            ..Default::default()
        };
        let desired =
            NetnsState { links: vec![link("kup-b")], addresses: vec![prev.addresses[1].clone()], ..Default::default() };
        let merged = keep_previous(&desired, &prev);
        assert_eq!(merged.links.len(), 2);
        assert_eq!(merged.addresses.len(), 2);
        assert_eq!(merged.routes, prev.routes);
        assert_eq!(merged.ip_rules, prev.ip_rules);
        // Nothing to keep when the previous state is the desired one.
        assert_eq!(keep_previous(&prev, &prev), prev);
    }
}
