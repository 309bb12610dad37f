//! Namespaces kept by reference: a pod's network namespace found on this node without trusting
//! any name, and a namespace held open for as long as it is kept.
//!
//! A pod is found by asking the container runtime when a CRI socket is set ([`cri`]: the pod's
//! ready sandbox by its UID, and the network namespace its verbose status names). The runtime's
//! answer is final: when it has no ready sandbox of the pod, or does not answer, or its socket
//! is gone, the pod is not found (refused with that reason; the next state asks again), never
//! searched for by address, since a pod address the runtime no longer backs may already be
//! another pod's. Only on a node without a runtime socket (the lab) is a pod found among the
//! namespaces pinned under /var/run/netns and those of running processes (/proc/*/ns/net), each
//! counted once by its inode: its namespace is the one that holds every one of the pod's
//! addresses on a link other than loopback, and none of whose processes is in another pod's
//! cgroup (the kubelet names a pod's cgroup by its UID). The host's namespace (this process's,
//! and the one configured for the node's own entry) is never a pod's, whoever names it.
//!
//! A held pod namespace also knows how the kernel reads socket owners in it ([`ids`]).
//!
//! [`Held`] keeps the namespace file open, and every operation goes through the open file
//! (`/proc/self/fd/N`), so the path or inode it was found by cannot come to mean another
//! namespace. The open file (and the keeper's own sockets) keep the namespace alive, so a pod
//! that is gone shows only as its namespace no longer being reachable: see [`Held::reachable`].

use std::fmt;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kuport_proto::v1::PodRef;

use crate::rtnl;

pub mod cri;
pub mod ids;

pub use ids::{IdError, IdRange, OwnerIds};

/// Where namespaces are pinned (`ip netns add`, CNI plugins, container runtimes).
const PINNED: &str = "/var/run/netns";
/// Where each process shows its namespace.
const PROC: &str = "/proc";

/// A namespace's identity: the device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

impl NsId {
    /// The namespace `path` refers to.
    pub fn of(path: &Path) -> std::io::Result<NsId> {
        let m = std::fs::metadata(path)?;
        Ok(NsId { dev: m.dev(), ino: m.ino() })
    }

    fn of_file(file: &File) -> std::io::Result<NsId> {
        let m = file.metadata()?;
        Ok(NsId { dev: m.dev(), ino: m.ino() })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PodnsError {
    #[error("network namespace not found on this node")]
    NotFound,
    #[error("network namespace not found on this node: {count} namespaces hold its addresses")]
    Ambiguous { count: usize },
    #[error("no valid address to find its network namespace by (status.podIPs)")]
    NoAddress,
    #[error(
        "network namespace not found on this node: only the host's holds {address}, and the host's is never a pod's"
    )]
    HostAddress { address: IpAddr },
    #[error("{path}: {source}", path = path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "the container runtime runs sandbox {sandbox} in the host's network namespace{}, and the host's is never a pod's",
        path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default()
    )]
    CriHost { sandbox: String, path: Option<PathBuf> },
    #[error("the container runtime names {path} for sandbox {sandbox}, which cannot be opened: {source}", path = path.display())]
    CriPath { sandbox: String, path: PathBuf, source: std::io::Error },
    /// The runtime has no ready sandbox of the pod: final (see the module's text).
    #[error(
        "the container runtime at {socket} has no ready sandbox of the pod{}; a pod the runtime does not run is not searched for by address",
        uid.as_ref().map(|u| format!(" (uid {u})")).unwrap_or_default(),
        socket = socket.display()
    )]
    CriNoSandbox { socket: PathBuf, uid: Option<String> },
    /// The runtime did not answer, or its socket is gone: not searched for by address either.
    #[error("{0}; a pod is not searched for by address while a runtime socket is set")]
    Cri(#[from] cri::CriError),
    /// A process in the namespace found by address is in another pod's cgroup.
    #[error("network namespace not found on this node: the one holding its addresses runs pod {other}'s processes")]
    OtherPod { other: String },
    /// Its rules' socket owners cannot be matched in it ([`IdError`]).
    #[error(transparent)]
    Owners(#[from] IdError),
}

/// A namespace held open.
#[derive(Debug)]
pub struct Held {
    file: File,
    id: NsId,
    how: Reach,
    /// How socket owners read in it (a pod's; a file's are as sent).
    owners: OwnerIds,
}

/// How a held namespace is reached, which is what [`Held::reachable`] checks.
#[derive(Debug, Clone)]
enum Reach {
    /// A namespace file named by the state (the lab's): reachable while that file is it.
    File(PathBuf),
    /// A pod's: reachable while a pin or a process still has it (`last` is where it was seen).
    Pod { pod: String, last: PathBuf },
}

impl Held {
    /// Holds the namespace `path` names (a file such as /var/run/netns/NAME).
    pub fn open(path: &Path) -> Result<Held, PodnsError> {
        let io = |source| PodnsError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let id = NsId::of_file(&file).map_err(io)?;
        Ok(Held { file, id, how: Reach::File(path.to_path_buf()), owners: OwnerIds::AsInPod })
    }

    /// The same namespace held a second time (its file duplicated): for reading it while its
    /// keeper's thread holds the first, without ever reaching another namespace.
    pub fn try_clone(&self) -> Result<Held, PodnsError> {
        let io = |source| PodnsError::Io { path: self.path(), source };
        Ok(Held {
            file: self.file.try_clone().map_err(io)?,
            id: self.id,
            how: self.how.clone(),
            owners: self.owners.clone(),
        })
    }

    /// How the rules' socket owners must be translated for this namespace.
    pub fn owners(&self) -> &OwnerIds {
        &self.owners
    }

    /// The path every operation on the namespace opens: the held file itself.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    pub fn id(&self) -> NsId {
        self.id
    }

    /// Whether the namespace can still be reached other than through our own file: its file
    /// still is it; a pod's is still pinned or some process is still in it.
    pub fn reachable(&mut self) -> bool {
        match &mut self.how {
            Reach::File(path) => NsId::of(path).is_ok_and(|id| id == self.id),
            Reach::Pod { last, .. } => {
                if NsId::of(last).is_ok_and(|id| id == self.id) {
                    return true;
                }
                match namespaces().into_iter().find(|(_, id)| *id == self.id) {
                    Some((path, _)) => {
                        *last = path;
                        true
                    }
                    None => false,
                }
            }
        }
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.how {
            Reach::File(path) => write!(f, "{}", path.display()),
            Reach::Pod { pod, .. } => write!(f, "of pod {pod}"),
        }
    }
}

/// The identities of the host's namespace: this process's, and `configured` (the namespace the
/// node's own entry is applied in) when given.
pub fn host_ids(configured: Option<&Path>) -> Vec<NsId> {
    let own = Path::new("/proc/self/ns/net");
    [Some(own), configured].into_iter().flatten().filter_map(|p| NsId::of(p).ok()).collect()
}

/// Finds `pod`'s namespace on this node by its addresses and holds it. `host` are the host's
/// namespaces, which are never a pod's.
pub fn resolve(pod: &PodRef, host: &[NsId]) -> Result<Held, PodnsError> {
    resolve_with(pod, host, None)
}

/// Finds `pod`'s namespace: named by the runtime at `cri` when a socket is set (its answer is
/// final), else by address.
pub fn resolve_with(pod: &PodRef, host: &[NsId], cri: Option<&Path>) -> Result<Held, PodnsError> {
    let name = || format!("{}/{}", pod.namespace, pod.name);
    let Some(socket) = cri else { return by_address(pod, host) };
    if !socket.exists() {
        let reason = "the socket does not exist".to_string();
        return Err(cri::CriError::Unreachable { socket: socket.to_path_buf(), reason }.into());
    }
    match cri::sandbox(socket, pod)? {
        Some(sandbox) => from_sandbox(name(), sandbox, host),
        None => {
            let uid = Some(pod.uid.clone()).filter(|u| !u.is_empty());
            Err(PodnsError::CriNoSandbox { socket: socket.to_path_buf(), uid })
        }
    }
}

/// Holds the namespace the runtime named for the pod's sandbox, unless it is the host's.
fn from_sandbox(pod: String, s: cri::Sandbox, host: &[NsId]) -> Result<Held, PodnsError> {
    let Some(path) = s.netns else { return Err(PodnsError::CriHost { sandbox: s.id, path: None }) };
    let file = File::open(&path).map_err(|source| PodnsError::CriPath {
        sandbox: s.id.clone(),
        path: path.clone(),
        source,
    })?;
    let id = NsId::of_file(&file).map_err(|source| PodnsError::CriPath {
        sandbox: s.id.clone(),
        path: path.clone(),
        source,
    })?;
    if host.contains(&id) {
        return Err(PodnsError::CriHost { sandbox: s.id, path: Some(path) });
    }
    let owners = ids::owner_ids(&file, id, s.pid);
    tracing::info!(pod = %pod, sandbox = %s.id, netns = %path.display(), "pod network namespace named by the runtime");
    Ok(Held { file, id, how: Reach::Pod { pod, last: path }, owners })
}

fn by_address(pod: &PodRef, host: &[NsId]) -> Result<Held, PodnsError> {
    let wanted = addresses(pod);
    if wanted.is_empty() {
        return Err(PodnsError::NoAddress);
    }
    let mut candidates = Vec::new();
    for (path, _) in distinct(namespaces(), host) {
        // Opened first: what is read and then held is this file, whatever the path means later.
        let Ok(file) = File::open(&path) else { continue };
        let Ok(id) = NsId::of_file(&file) else { continue };
        if host.contains(&id) {
            continue;
        }
        let inside = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        // A namespace that cannot be read (its process just ended) is not the pod's.
        let held = rtnl::addresses(Some(&inside)).unwrap_or_default();
        candidates.push(Candidate { path, file, addresses: held.into_iter().map(|(_, a)| a).collect() });
    }
    let index = match pick(&wanted, &candidates) {
        Err(PodnsError::NotFound) => return Err(host_holds(&wanted, host).unwrap_or(PodnsError::NotFound)),
        other => other?,
    };
    let c = candidates.swap_remove(index);
    let id = NsId::of_file(&c.file).map_err(|source| PodnsError::Io { path: c.path.clone(), source })?;
    if let Some(other) = other_pod(id, &pod.uid) {
        return Err(PodnsError::OtherPod { other });
    }
    let owners = ids::owner_ids(&c.file, id, None);
    Ok(Held {
        file: c.file,
        id,
        how: Reach::Pod { pod: format!("{}/{}", pod.namespace, pod.name), last: c.path },
        owners,
    })
}

/// The refusal naming the host when one of the host's namespaces holds a wanted address.
fn host_holds(wanted: &[IpAddr], host: &[NsId]) -> Option<PodnsError> {
    let mut seen = std::collections::BTreeSet::new();
    for (path, id) in namespaces() {
        if !host.contains(&id) || !seen.insert(id) {
            continue;
        }
        let held = rtnl::addresses(Some(&path)).unwrap_or_default();
        if let Some(address) = held.into_iter().map(|(_, a)| a).find(|a| wanted.contains(a)) {
            return Some(PodnsError::HostAddress { address });
        }
    }
    None
}

struct Candidate {
    path: PathBuf,
    file: File,
    /// The addresses on its links other than loopback.
    addresses: Vec<IpAddr>,
}

/// The pod's addresses that parse.
fn addresses(pod: &PodRef) -> Vec<IpAddr> {
    pod.addresses.iter().filter_map(|a| a.parse().ok()).collect()
}

/// The one candidate holding all of `wanted`. Ambiguous also when another holds some of them:
/// two namespaces claiming one pod's addresses are not told apart by guessing.
fn pick(wanted: &[IpAddr], candidates: &[Candidate]) -> Result<usize, PodnsError> {
    let some: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.addresses.iter().any(|a| wanted.contains(a)))
        .map(|(i, _)| i)
        .collect();
    let all = |i: &usize| wanted.iter().all(|w| candidates[*i].addresses.contains(w));
    match some[..] {
        [one] if all(&one) => Ok(one),
        [] | [_] => Err(PodnsError::NotFound),
        _ => Err(PodnsError::Ambiguous { count: some.len() }),
    }
}

/// The UID of another pod than `uid` that some process in namespace `id` belongs to, by its
/// cgroup (the kubelet names a pod's cgroup by its UID). None when no process names a pod,
/// as in the lab, whose namespaces are not the kubelet's.
fn other_pod(id: NsId, uid: &str) -> Option<String> {
    let pids =
        namespaces().into_iter().filter(|(_, i)| *i == id).filter_map(|(p, _)| p.parent().map(Path::to_path_buf));
    for dir in pids.filter(|d| d.starts_with(PROC)) {
        let Ok(text) = std::fs::read_to_string(dir.join("cgroup")) else { continue };
        if let Some(other) = cgroup_pod_uids(&text).into_iter().find(|u| *u != uid) {
            return Some(other);
        }
    }
    None
}

/// The pod UIDs a /proc/PID/cgroup names: `.../pod<UID>/...` (cgroupfs) or
/// `...-pod<UID with _>.slice` (systemd).
fn cgroup_pod_uids(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for segment in text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).flat_map(|p| p.split('/')) {
        let segment = segment.strip_suffix(".slice").unwrap_or(segment);
        let Some(rest) = segment.strip_prefix("pod").or_else(|| segment.rsplit_once("-pod").map(|(_, r)| r)) else {
            continue;
        };
        let rest = rest.replace('_', "-");
        let uuid = rest.len() == 36
            && rest
                .char_indices()
                .all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() });
        if uuid && !out.contains(&rest) {
            out.push(rest);
        }
    }
    out
}

/// Every namespace file on the node, pins first, with its identity.
fn namespaces() -> Vec<(PathBuf, NsId)> {
    let mut paths = Vec::new();
    if let Ok(dir) = std::fs::read_dir(PINNED) {
        paths.extend(dir.flatten().map(|e| e.path()));
    }
    if let Ok(dir) = std::fs::read_dir(PROC) {
        let pids =
            dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())));
        paths.extend(pids.map(|e| e.path().join("ns/net")));
    }
    paths.into_iter().filter_map(|p| NsId::of(&p).ok().map(|id| (p, id))).collect()
}

/// `found` with each namespace once (its first path) and the host's left out.
fn distinct(found: Vec<(PathBuf, NsId)>, host: &[NsId]) -> Vec<(PathBuf, NsId)> {
    let mut seen = std::collections::BTreeSet::new();
    found.into_iter().filter(|(_, id)| !host.contains(id) && seen.insert(*id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> NsId {
        NsId { dev: 4, ino }
    }

    fn candidate(addresses: &[&str]) -> Candidate {
        Candidate {
            path: PathBuf::from("/dev/null"),
            file: File::open("/dev/null").expect("/dev/null"),
            addresses: addresses.iter().map(|a| a.parse().expect("address")).collect(),
        }
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().expect("address")
    }

    #[test]
    fn each_namespace_counts_once_and_the_host_never() {
        let found = vec![
            (PathBuf::from("/var/run/netns/a"), id(10)),
            (PathBuf::from("/proc/1/ns/net"), id(1)),
            (PathBuf::from("/proc/7/ns/net"), id(10)),
            (PathBuf::from("/proc/8/ns/net"), id(11)),
            (PathBuf::from("/proc/9/ns/net"), id(1)),
        ];
        let kept = distinct(found, &[id(1)]);
        let paths: Vec<&str> = kept.iter().filter_map(|(p, _)| p.to_str()).collect();
        assert_eq!(paths, ["/var/run/netns/a", "/proc/8/ns/net"]);
    }

    #[test]
    fn the_namespace_holding_an_address_is_the_pods() {
        let candidates = vec![candidate(&["10.0.0.1"]), candidate(&["10.244.1.7", "fd00::7"]), candidate(&[])];
        assert_eq!(pick(&[ip("10.244.1.7")], &candidates).expect("found"), 1);
        assert_eq!(pick(&[ip("10.244.1.7"), ip("fd00::7")], &candidates).expect("by both addresses"), 1);
        // A namespace holding only some of the pod's addresses is not the pod's.
        assert!(matches!(pick(&[ip("10.9.9.9"), ip("fd00::7")], &candidates), Err(PodnsError::NotFound)));
        assert!(matches!(pick(&[ip("10.9.9.9")], &candidates), Err(PodnsError::NotFound)));
        let split = vec![candidate(&["10.244.1.7"]), candidate(&["10.244.1.7", "fd00::7"])];
        assert!(matches!(pick(&[ip("10.244.1.7"), ip("fd00::7")], &split), Err(PodnsError::Ambiguous { count: 2 })));
        let twice = vec![candidate(&["10.244.1.7"]), candidate(&["10.244.1.7"])];
        assert!(matches!(pick(&[ip("10.244.1.7")], &twice), Err(PodnsError::Ambiguous { count: 2 })));
    }

    #[test]
    fn a_processs_cgroup_names_its_pod() {
        let cgroupfs = "0::/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abc123\n";
        assert_eq!(cgroup_pod_uids(cgroupfs), ["0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"]);
        let systemd = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-abc.scope\n";
        assert_eq!(cgroup_pod_uids(systemd), ["0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"]);
        assert!(cgroup_pod_uids("0::/user.slice/user-0.slice/session-3.scope\n").is_empty());
        assert!(cgroup_pod_uids("0::/podman/pod-notauuid\n").is_empty());
    }

    #[test]
    fn only_valid_addresses_identify_a_pod() {
        let pod = PodRef { addresses: vec!["10.244.1.7".into(), "nonsense".into()], ..Default::default() };
        assert_eq!(addresses(&pod), [ip("10.244.1.7")]);
        assert!(matches!(resolve(&PodRef::default(), &[]), Err(PodnsError::NoAddress)));
    }
}
