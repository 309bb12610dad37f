//! The real applier: one [`Keeper`] (an executor on its own thread, repairing drift) per network
//! namespace of the node state, by its target: the host's, a namespace file (the lab's), or a
//! pod's, found on the node by [`podns`].
//!
//! Each namespace carries its own version: a keeper that holds it applies nothing, and a
//! namespace sent held (no content) is kept as it is when the keeper holds that version, and
//! refused otherwise, so that the controller sends it whole. A keeper whose namespace can no
//! longer be reached ends on its own; it is forgotten, and a later state that names the
//! namespace again starts a new one.
//!
//! A pod's namespace is found by asking the container runtime's CRI when a socket is set (its
//! "no such pod" is final), else by its address ([`podns::resolve_with`]), and its rules'
//! socket owners are translated to how the kernel reads them there ([`podns::OwnerIds`]) before
//! they are applied.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kuport_proto::v1::{
    LinkCounters, NetnsRef, NetnsState, NftFamily, NodeState, ObjectError, PeerStatus, PodCounters, PodRef, netns_ref,
};

use super::client::NodeApplier;
use crate::executor::{ExecError, Keeper, Stats, drop_elsewhere, spawn_keeper, spawn_keeper_held};
use crate::podns::{self, Held, NsId, OwnerIds};
use crate::wireguard::reach::{self, Prober, Target, Targets};

pub struct NodeKeepers {
    /// Where the host entry is applied; None: this process's namespace.
    host_netns: Option<PathBuf>,
    /// The host's namespaces, never a pod's.
    host_ids: Vec<NsId>,
    /// By [`NetnsState::describe`].
    kept: BTreeMap<String, Kept>,
    /// The drift repairs of keepers forgotten since, so that the total only grows.
    forgotten_repairs: u64,
    /// The container runtime's CRI socket pods are asked of first.
    cri: Option<PathBuf>,
    /// Whether each WireGuard peer's direct path works (docs/overlay/reach.md).
    prober: Arc<Mutex<Prober>>,
    /// The relay rule's bytes as last read.
    relayed: std::sync::atomic::AtomicU64,
    /// The pods the last state programs, by [`NetnsState::describe`]: whose tables a counter
    /// read reports.
    pods: BTreeMap<String, DesiredPod>,
}

/// A pod namespace the last state named, and why it was refused, if it was.
struct DesiredPod {
    pod: PodRef,
    refused: Option<String>,
}

struct Kept {
    target: Option<NetnsRef>,
    keeper: Keeper,
    /// The last state applied without refusal (as the controller sent it), and so the version
    /// the namespace holds.
    state: Option<Arc<NetnsState>>,
    /// How the namespace's socket owners read (a pod's; others as sent).
    owners: OwnerIds,
    /// A pod's namespace held a second time (the keeper's thread holds the first), to read its
    /// counters in; None for others.
    reader: Option<Arc<Held>>,
}

impl Kept {
    fn holds(&self, version: &str) -> bool {
        !version.is_empty() && self.state.as_ref().is_some_and(|s| s.version == version)
    }
}

impl NodeKeepers {
    pub fn new(host_netns: Option<PathBuf>) -> Self {
        let host_ids = podns::host_ids(host_netns.as_deref());
        let prober = Arc::new(Mutex::new(Prober::new(host_netns.clone())));
        NodeKeepers {
            host_netns,
            host_ids,
            kept: BTreeMap::new(),
            forgotten_repairs: 0,
            cri: None,
            prober,
            relayed: Default::default(),
            pods: BTreeMap::new(),
        }
    }

    /// Asks the container runtime at `socket` for pods' namespaces (docs/intercept/table.md,
    /// "Finding a pod's namespace").
    pub fn with_cri(mut self, socket: Option<PathBuf>) -> Self {
        self.cri = socket;
        self
    }

    /// The namespaces kept now, by [`NetnsState::describe`] (those whose keeper ended are not).
    pub fn namespaces(&self) -> Vec<String> {
        self.kept.iter().filter(|(_, k)| !k.keeper.ended()).map(|(key, _)| key.clone()).collect()
    }

    /// The stats of the keeper of namespace `key` ([`NetnsState::describe`]), if it is kept.
    pub fn stats(&self, key: &str) -> Option<Stats> {
        self.kept.get(key).map(|k| k.keeper.stats().get())
    }

    /// Forgets the keepers that ended (their namespace is gone, or their watches failed).
    fn forget_ended(&mut self) {
        let ended: Vec<String> =
            self.kept.iter().filter(|(_, k)| k.keeper.ended()).map(|(key, _)| key.clone()).collect();
        for key in ended {
            let why = self.forget(&key).and_then(|s| s.last_error).unwrap_or_default();
            tracing::info!(netns = %key, reason = %why, "keeper ended; forgotten");
        }
    }

    /// Drops the keeper of `key`; its last stats.
    fn forget(&mut self, key: &str) -> Option<Stats> {
        let stats = self.kept.remove(key)?.keeper.stats().get();
        self.forgotten_repairs += stats.drift_repairs;
        Some(stats)
    }

    /// The keeper of `ns`, started (its namespace found and held) if there is none.
    fn keeper(&mut self, key: &str, ns: &NetnsState) -> Result<Keeper, ObjectError> {
        if let Some(k) = self.kept.get(key) {
            return Ok(k.keeper.clone());
        }
        let refused = |e: &dyn std::fmt::Display| ObjectError { object: namespace(key), reason: e.to_string() };
        let mut owners = OwnerIds::AsInPod;
        let mut reader = None;
        let keeper = match ns.target.as_ref().and_then(|t| t.kind.as_ref()) {
            None => spawn_keeper(self.host_netns.clone()),
            Some(netns_ref::Kind::Path(p)) if p.is_empty() => spawn_keeper(self.host_netns.clone()),
            Some(netns_ref::Kind::Path(p)) => {
                let held = Held::open(std::path::Path::new(p)).map_err(|e| refused(&e))?;
                spawn_keeper_held(held)
            }
            Some(netns_ref::Kind::Pod(pod)) => {
                let held = podns::resolve_with(pod, &self.host_ids, self.cri.as_deref())
                    .map_err(|e| ObjectError { object: pod_object(pod), reason: e.to_string() })?;
                tracing::info!(netns = %key, id = ?held.id(), owners = ?held.owners(), "pod network namespace found");
                owners = held.owners().clone();
                reader = second_hold(key, &held);
                spawn_keeper_held(held)
            }
        }
        .map_err(|e| refused(&e))?;
        let target = ns.target.clone();
        self.kept.insert(key.to_string(), Kept { target, keeper: keeper.clone(), state: None, owners, reader });
        Ok(keeper)
    }
}

impl NodeKeepers {
    /// The WireGuard devices of the host namespace's applied state: the overlay's.
    fn host_devices(&self) -> impl Iterator<Item = &kuport_proto::v1::WireguardDevice> {
        self.kept
            .values()
            .filter_map(|k| k.state.as_ref().filter(|s| s.is_host()))
            .flat_map(|s| s.wireguard_devices.iter())
    }

    /// Programs the new sandbox of each restarted pod: a pod keeper that ended (its namespace
    /// went) while it held a state is started again on the namespace that now holds the pod's
    /// address, with that state, without waiting for the controller (whose state did not
    /// change). Not found yet: tried again on the next call. The client calls it every drift
    /// poll (200 ms); with the keepers' reachability check that reprograms a pod within a
    /// second of its new sandbox (docs/intercept/table.md, lifecycle).
    pub async fn restarted(&mut self) {
        let ended: Vec<(String, PodRef, Arc<NetnsState>)> = self
            .kept
            .iter()
            .filter(|(_, k)| k.keeper.ended())
            .filter_map(|(key, k)| match (k.target.as_ref().and_then(|t| t.kind.as_ref()), &k.state) {
                (Some(netns_ref::Kind::Pod(pod)), Some(state)) => Some((key.clone(), pod.clone(), Arc::clone(state))),
                _ => None,
            })
            .collect();
        for (key, pod, state) in ended {
            let Ok(held) = podns::resolve_with(&pod, &self.host_ids, self.cri.as_deref()) else { continue };
            tracing::info!(netns = %key, id = ?held.id(), "pod network namespace replaced; reprogramming it");
            let owners = held.owners().clone();
            let reader = second_hold(&key, &held);
            let keeper = match spawn_keeper_held(held) {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(netns = %key, error = %e, "pod keeper not restarted");
                    continue;
                }
            };
            self.forget(&key);
            let result = match owners.apply(&state) {
                Ok(translated) => keeper.apply(Arc::new(translated)).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let held = match result {
                Ok(_) => Some(state),
                Err(e) => {
                    // The controller's next state applies it again.
                    tracing::warn!(netns = %key, error = %e, "restarted pod's namespace refused its state");
                    None
                }
            };
            let target = Some(NetnsRef { kind: Some(netns_ref::Kind::Pod(pod)) });
            self.kept.insert(key, Kept { target, keeper, state: held, owners, reader });
        }
    }
}

/// Every peer of `devices` in `netns` as WireGuard holds it now, by public key, with its reach
/// as `prober` found it: what the client reports (docs/overlay/status.md,
/// docs/overlay/reach.md). A device that cannot be read is left out (logged).
fn peer_status(netns: Option<&std::path::Path>, devices: &[String], prober: &Mutex<Prober>) -> Vec<PeerStatus> {
    let Some(wg) = crate::wireguard::installed() else { return Vec::new() };
    let mut out = Vec::new();
    let prober = prober.lock().unwrap_or_else(|e| e.into_inner());
    for name in devices {
        match crate::wireguard::show(&wg, netns, name) {
            Ok(Some(device)) => out.extend(device.peers.iter().map(|p| PeerStatus {
                public_key: p.public_key.to_string(),
                endpoint: p.endpoint.map(|e| e.to_string()).unwrap_or_default(),
                last_handshake_unix_seconds: p.last_handshake.map_or(0, |d| d.as_secs()),
                receive_bytes: p.rx_bytes,
                transmit_bytes: p.tx_bytes,
                reach: prober.reach(name, &p.public_key.to_string()) as i32,
            })),
            Ok(None) => {}
            Err(e) => tracing::debug!(device = %name, error = %e, "reading WireGuard peers"),
        }
    }
    out.sort_by(|a, b| a.public_key.cmp(&b.public_key));
    out
}

/// `held` held a second time, for counter reads; None (logged) when its file cannot be
/// duplicated, and the pod's counters then say so.
fn second_hold(key: &str, held: &Held) -> Option<Arc<Held>> {
    held.try_clone()
        .map(Arc::new)
        .inspect_err(|e| tracing::warn!(netns = %key, error = %e, "not held for reading"))
        .ok()
}

/// The counters of `tables` in the namespace `held`, as [`NodeApplier::pod_counters`] reports
/// them: those read before a failure are kept, and the failure named.
fn pod_tables(pod: PodRef, held: &Held, tables: &[(NftFamily, String)]) -> PodCounters {
    let mut out = PodCounters { pod: Some(pod), ..Default::default() };
    let path = held.path();
    for (family, name) in tables {
        match crate::netfilter::nft::read_counters(Some(&path), *family, name) {
            Ok(Some(t)) => out.tables.push(t),
            Ok(None) => {}
            Err(e) => {
                out.error = format!("table {name}: {e}");
                break;
            }
        }
    }
    out
}

/// The (family, name) of each table of `state`.
fn table_names(state: &NetnsState) -> Vec<(NftFamily, String)> {
    state.nft_tables.iter().map(|t| (t.family(), t.name.clone())).collect()
}

fn namespace(key: &str) -> String {
    format!("network namespace {key:?}")
}

fn pod_object(pod: &PodRef) -> String {
    format!("pod {}/{}", pod.namespace, pod.name)
}

impl NodeKeepers {
    /// Applies the entry `key` of a new state (`absent`: the keys kept but no longer sent),
    /// adding each refusal to `errors`.
    async fn entry(&mut self, key: &str, ns: NetnsState, absent: &[String], errors: &mut Vec<ObjectError>) {
        if ns.held {
            let holding = self.kept.get(key).and_then(|k| k.state.as_ref()).map(|s| s.version.clone());
            if holding.as_deref() != Some(ns.version.as_str()) {
                let holds = holding.map_or_else(|| "nothing".to_string(), |v| format!("version {v}"));
                errors.push(ObjectError {
                    object: namespace(key),
                    reason: format!(
                        "version {} is not held here (it holds {holds}): {}",
                        ns.version,
                        kuport_proto::delta::SEND_WHOLE
                    ),
                });
            }
            return;
        }
        if self.kept.get(key).is_some_and(|k| k.holds(&ns.version)) {
            drop_elsewhere(Arc::new(ns));
            return;
        }
        let keeper = match self.keeper(key, &ns) {
            Ok(k) => k,
            Err(e) => {
                errors.push(e);
                return;
            }
        };
        // Until this apply succeeds the namespace holds no known version; and the keeper's
        // copy of the old state is then its last, which it frees off this path.
        if let Some(k) = self.kept.get_mut(key) {
            k.state = None;
        }
        let ns = Arc::new(ns);
        // The kernel's view of socket owners in this namespace; the controller's state is
        // what is remembered (and versioned).
        let owners = self.kept.get(key).map(|k| k.owners.clone()).unwrap_or(OwnerIds::AsInPod);
        let applied = match owners.apply_if_needed(&ns) {
            Ok(None) => Arc::clone(&ns),
            Ok(Some(t)) => Arc::new(t),
            Err(e) => {
                let object = match ns.target.as_ref().and_then(|t| t.kind.as_ref()) {
                    Some(netns_ref::Kind::Pod(pod)) => pod_object(pod),
                    _ => namespace(key),
                };
                errors.push(ObjectError { object, reason: e.to_string() });
                return;
            }
        };
        match keeper.apply(applied).await {
            Ok(_) if absent.iter().any(|a| a == key) && !ns.is_host() => {
                self.forget(key);
            }
            Ok(_) => {
                if let Some(k) = self.kept.get_mut(key) {
                    k.state = Some(ns);
                }
            }
            Err(ExecError::Refused { report }) => {
                errors.extend(report.errors.into_iter().map(|e| ObjectError { object: e.object, reason: e.reason }))
            }
            Err(e) => errors.push(ObjectError { object: namespace(key), reason: e.to_string() }),
        }
    }
}

impl NodeApplier for NodeKeepers {
    async fn apply(&mut self, state: NodeState) -> Result<(), Vec<ObjectError>> {
        self.forget_ended();
        let mut entries: BTreeMap<String, NetnsState> = state.netns.into_iter().map(|ns| (ns.describe(), ns)).collect();
        self.pods = entries
            .iter()
            .filter_map(|(key, ns)| match ns.target.as_ref().and_then(|t| t.kind.as_ref()) {
                Some(netns_ref::Kind::Pod(pod)) => Some((key.clone(), DesiredPod { pod: pod.clone(), refused: None })),
                _ => None,
            })
            .collect();
        // A namespace kept before but absent now: its kuport objects go (the host entry is
        // then an empty state; a pod's or a file's keeper is forgotten once it emptied it).
        let mut absent = Vec::new();
        for (key, k) in &self.kept {
            if !entries.contains_key(key) {
                absent.push(key.clone());
                entries.insert(key.clone(), NetnsState { target: k.target.clone(), ..Default::default() });
            }
        }
        let mut errors = Vec::new();
        for (key, ns) in entries {
            let before = errors.len();
            self.entry(&key, ns, &absent, &mut errors).await;
            if let Some(p) = self.pods.get_mut(&key).filter(|_| errors.len() > before) {
                let reasons: Vec<&str> = errors[before..].iter().map(|e| e.reason.as_str()).collect();
                p.refused = Some(reasons.join("; "));
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    fn drift(&self) -> (u64, Vec<String>) {
        let mut total = self.forgotten_repairs;
        let mut last = Vec::new();
        for k in self.kept.values() {
            let s = k.keeper.stats().get();
            total += s.drift_repairs;
            if s.drift_repairs > 0 {
                last.extend(s.last_differences);
            }
        }
        (total, last)
    }

    fn held(&self, ns: &NetnsState) -> Option<Arc<NetnsState>> {
        let k = self.kept.get(&ns.describe())?;
        k.state.as_ref().filter(|s| s.version == ns.version).cloned()
    }

    async fn tend(&mut self) {
        self.restarted().await;
    }

    async fn peers(&self) -> Vec<PeerStatus> {
        let devices: Vec<String> = self.host_devices().map(|d| d.name.clone()).collect();
        if devices.is_empty() {
            return Vec::new();
        }
        let netns = self.host_netns.clone();
        let prober = Arc::clone(&self.prober);
        tokio::task::spawn_blocking(move || peer_status(netns.as_deref(), &devices, &prober)).await.unwrap_or_default()
    }

    async fn relayed_bytes(&self) -> u64 {
        use kuport_proto::v1::NftFamily;
        let overlay = self
            .kept
            .values()
            .filter_map(|k| k.state.as_ref().filter(|s| s.is_host()))
            .flat_map(|s| s.nft_tables.iter())
            .any(|t| t.family == NftFamily::Inet as i32 && t.name == reach::OVERLAY_TABLE);
        if !overlay {
            return 0;
        }
        let netns = self.host_netns.clone();
        let read = move || {
            crate::netfilter::nft::accepted_bytes(
                netns.as_deref(),
                NftFamily::Inet,
                reach::OVERLAY_TABLE,
                &reach::RELAY_SETS,
            )
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(Ok(bytes)) => {
                self.relayed.store(bytes, std::sync::atomic::Ordering::Relaxed);
                bytes
            }
            // The last value read: a failed read is no drop in the count.
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "reading the relay rule's counter");
                self.relayed.load(std::sync::atomic::Ordering::Relaxed)
            }
            Err(_) => self.relayed.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    async fn counters(&self) -> Result<Vec<kuport_proto::v1::TableCounters>, String> {
        let tables: Vec<(kuport_proto::v1::NftFamily, String)> = self
            .kept
            .values()
            .filter_map(|k| k.state.as_ref().filter(|s| s.is_host()))
            .flat_map(|s| s.nft_tables.iter())
            .map(|t| (t.family(), t.name.clone()))
            .collect();
        let netns = self.host_netns.clone();
        let read = move || {
            let mut out = Vec::new();
            for (family, name) in tables {
                match crate::netfilter::nft::read_counters(netns.as_deref(), family, &name) {
                    Ok(Some(t)) => out.push(t),
                    Ok(None) => {}
                    Err(e) => return Err(format!("table {name}: {e}")),
                }
            }
            Ok(out)
        };
        tokio::task::spawn_blocking(read).await.map_err(|e| e.to_string())?
    }

    async fn link_counters(&self) -> Result<Vec<LinkCounters>, String> {
        let names: Vec<String> = self
            .kept
            .values()
            .filter_map(|k| k.state.as_ref().filter(|s| s.is_host()))
            .flat_map(|s| {
                s.links.iter().map(|l| l.name.clone()).chain(s.wireguard_devices.iter().map(|d| d.name.clone()))
            })
            .collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let netns = self.host_netns.clone();
        let read = move || crate::rtnl::link_counters(netns.as_deref(), &names).map_err(|e| e.to_string());
        tokio::task::spawn_blocking(read).await.map_err(|e| e.to_string())?
    }

    async fn pod_counters(&self) -> Vec<PodCounters> {
        type Ready = Result<(Arc<Held>, Vec<(NftFamily, String)>), String>;
        let reads: Vec<(PodRef, Ready)> = self
            .pods
            .iter()
            .map(|(key, want)| {
                let ready = match self.kept.get(key) {
                    Some(k) if k.keeper.ended() => {
                        let why = k.keeper.stats().get().last_error.unwrap_or_default();
                        Err(format!("its network namespace is no longer reachable: {why}"))
                    }
                    Some(Kept { state: Some(state), reader: Some(held), .. }) => {
                        Ok((Arc::clone(held), table_names(state)))
                    }
                    Some(Kept { state: Some(_), reader: None, .. }) => {
                        Err("its network namespace is not held for reading (see the executor's log)".to_string())
                    }
                    _ => Err(match &want.refused {
                        Some(why) => format!("not programmed: {why}"),
                        None => "not programmed yet".to_string(),
                    }),
                };
                (want.pod.clone(), ready)
            })
            .collect();
        if reads.is_empty() {
            return Vec::new();
        }
        let read = move || {
            reads
                .into_iter()
                .map(|(pod, ready)| match ready {
                    Ok((held, tables)) => pod_tables(pod, &held, &tables),
                    Err(error) => PodCounters { pod: Some(pod), error, ..Default::default() },
                })
                .collect()
        };
        tokio::task::spawn_blocking(read).await.unwrap_or_default()
    }

    async fn probe(&mut self) -> bool {
        let targets: Vec<Targets> = self
            .host_devices()
            .map(|d| Targets {
                device: d.name.clone(),
                peers: d.peers.iter().filter_map(|p| Target::of(&d.name, p)).collect(),
            })
            .filter(|t| !t.peers.is_empty())
            .collect();
        let prober = Arc::clone(&self.prober);
        if targets.is_empty() && prober.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return false;
        }
        let Some(wg) = crate::wireguard::installed() else { return false };
        tokio::task::spawn_blocking(move || prober.lock().unwrap_or_else(|e| e.into_inner()).round(&wg, &targets))
            .await
            .unwrap_or(false)
    }
}
