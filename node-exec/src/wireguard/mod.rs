//! WireGuard on the node (docs/overlay/node.md): the node's key ([`key`]), the devices a state
//! asks for and the plan to make them so ([`model`]), and two backends behind one [`Backend`]
//! trait, one module each: [`kernel`] (the kernel's generic-netlink family "wireguard", the
//! link made with rtnetlink) and [`userspace`] (`wireguard-go` in the foreground inside the
//! namespace, supervised, configured over its UAPI socket, [`uapi`]). The executor picks the
//! kernel when its link type exists.
//!
//! [`reach`] watches whether each peer's direct path works (docs/overlay/reach.md).
//!
//! Every change goes to a device peer by peer: peers that differ are added, updated in only
//! what differs, or removed; nothing is ever replaced device-wide, so an untouched peer keeps
//! its session.

pub mod kernel;
pub mod key;
pub mod model;
pub mod reach;
pub mod uapi;
pub mod userspace;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

pub use key::{KeyError, PrivateKey, PublicKey};
pub use model::{Device, DeviceConfig, DeviceSpec, Peer, PeerChange, PeerSpec};

/// What a backend or a desired device met.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The desired device is not well-formed.
    #[error("invalid {object}: {reason}")]
    Invalid { object: String, reason: String },
    /// The kernel has no WireGuard (no module): the userspace backend takes over.
    #[error("wireguard device {device}: the kernel has no WireGuard link type")]
    Unsupported { device: String },
    /// A device refused or failed an operation.
    #[error("wireguard device {device}: {op}: {reason}")]
    Device { device: String, op: &'static str, reason: String },
    /// The executor was given no key (it runs without a state directory).
    #[error("wireguard device {device}: the executor holds no WireGuard key")]
    NoKey { device: String },
}

impl Error {
    fn device(device: &str, op: &'static str, reason: impl ToString) -> Self {
        Error::Device { device: device.to_string(), op, reason: reason.to_string() }
    }
}

/// Which backend a device runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Kernel,
    Userspace,
}

impl BackendKind {
    /// The link kind the device shows in rtnetlink: `wireguard` for the kernel's, `tun` for
    /// wireguard-go's.
    pub fn link_kind(self) -> &'static str {
        match self {
            BackendKind::Kernel => "wireguard",
            BackendKind::Userspace => "tun",
        }
    }

    pub fn of_link_kind(kind: Option<&str>) -> Option<Self> {
        match kind {
            Some("wireguard") => Some(BackendKind::Kernel),
            Some("tun") => Some(BackendKind::Userspace),
            _ => None,
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Kernel => "kernel",
            BackendKind::Userspace => "userspace",
        })
    }
}

/// One way of running WireGuard devices. Every call runs on a thread inside the device's
/// network namespace (`netns` names it for what must enter it on its own, such as a process).
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Creates device `name`; [`Error::Unsupported`] when this backend cannot here.
    fn create(&self, netns: Option<&Path>, name: &str) -> Result<(), Error>;
    /// Reads the device: its key, port, mark, and every peer with its endpoint, allowed IPs,
    /// last handshake and counters. None when it does not exist.
    fn read(&self, name: &str) -> Result<Option<Device>, Error>;
    /// Sets what `config` holds (the node's private key, the listen port, the mark), only.
    fn configure(&self, name: &str, config: &DeviceConfig) -> Result<(), Error>;
    /// Applies `changes`, each touching its own peer alone (never a device-wide replace).
    fn apply_peers(&self, name: &str, changes: &[PeerChange]) -> Result<(), Error>;
    /// Deletes the device.
    fn delete(&self, name: &str) -> Result<(), Error>;
    /// Makes peer `spec` anew: removed and added again with exactly `spec`, in one request, so
    /// it holds no session, no staged packet and no timer, and WireGuard stops retrying its
    /// handshake (docs/overlay/reach.md, "The reset"). Both backends take a request's peers in
    /// order: wireguard-go's UAPI `remove=true` then a new `public_key=` line, the kernel's
    /// `WGPEER_F_REMOVE_ME` then a peer of the same key, which it no longer finds and so creates.
    fn reset_peer(&self, name: &str, spec: &PeerSpec) -> Result<(), Error> {
        self.apply_peers(name, &[PeerChange::Remove(spec.public_key), PeerChange::Add(spec.clone())])
    }
}

/// Which backend new devices get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    /// The kernel's when its link type exists, else userspace.
    #[default]
    Auto,
    Kernel,
    Userspace,
}

/// How the executor runs WireGuard.
#[derive(Debug, Clone)]
pub struct Options {
    pub choice: Choice,
    /// The userspace daemon (`wireguard-go` on the PATH by default).
    pub wireguard_go: PathBuf,
    /// Where wireguard-go puts its UAPI sockets (fixed by wireguard-go: /var/run/wireguard,
    /// shared by every namespace, so a name is one device per node).
    pub socket_dir: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            choice: Choice::Auto,
            wireguard_go: PathBuf::from("wireguard-go"),
            socket_dir: PathBuf::from(userspace::SOCKET_DIR),
        }
    }
}

/// The executor's WireGuard: the node's key and its backends.
#[derive(Debug)]
pub struct Wireguard {
    key: PrivateKey,
    choice: Choice,
    kernel: kernel::Kernel,
    userspace: userspace::Userspace,
    /// Set once creating a kernel device was refused for want of the link type.
    kernel_missing: AtomicBool,
}

impl Wireguard {
    pub fn new(key: PrivateKey, options: Options) -> Self {
        Wireguard {
            key,
            choice: options.choice,
            kernel: kernel::Kernel,
            userspace: userspace::Userspace::new(options.wireguard_go, options.socket_dir),
            kernel_missing: AtomicBool::new(false),
        }
    }

    /// The node's key from `state_dir` (made on first start, [`key::load_or_create`]).
    pub fn load(state_dir: &Path, options: Options) -> Result<Self, KeyError> {
        Ok(Wireguard::new(key::load_or_create(state_dir)?, options))
    }

    pub fn key(&self) -> &PrivateKey {
        &self.key
    }

    /// What the executor reports.
    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    pub fn backend(&self, kind: BackendKind) -> &dyn Backend {
        match kind {
            BackendKind::Kernel => &self.kernel,
            BackendKind::Userspace => &self.userspace,
        }
    }

    /// Creates device `name` on the chosen backend; with [`Choice::Auto`], on the kernel's
    /// unless its link type is missing (then, and from then on, userspace).
    pub fn create(&self, netns: Option<&Path>, name: &str) -> Result<BackendKind, Error> {
        let kernel_first = match self.choice {
            Choice::Kernel => true,
            Choice::Userspace => false,
            Choice::Auto => !self.kernel_missing.load(Ordering::Relaxed),
        };
        if kernel_first {
            match self.kernel.create(netns, name) {
                Ok(()) => return Ok(BackendKind::Kernel),
                Err(Error::Unsupported { .. }) if self.choice == Choice::Auto => {
                    tracing::info!(device = name, "no WireGuard in the kernel: using wireguard-go");
                    self.kernel_missing.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.userspace.create(netns, name)?;
        Ok(BackendKind::Userspace)
    }

    /// The process ids of the wireguard-go daemons this process started and that still run.
    pub fn userspace_pids(&self) -> Vec<u32> {
        self.userspace.pids()
    }
}

static INSTALLED: OnceLock<Arc<Wireguard>> = OnceLock::new();

/// Makes `wg` the WireGuard of every executor made from now on without one of its own
/// ([`crate::executor::Executor::with_wireguard`]); false if one was installed already.
pub fn install(wg: Arc<Wireguard>) -> bool {
    INSTALLED.set(wg).is_ok()
}

/// The WireGuard [`install`] set, if any.
pub fn installed() -> Option<Arc<Wireguard>> {
    INSTALLED.get().cloned()
}

/// Reads device `name` in `netns` (None: the caller's) on whichever backend runs it: for
/// stats (handshakes, counters) and the oracle-free checks. None when there is no such device.
pub fn show(wg: &Wireguard, netns: Option<&Path>, name: &str) -> Result<Option<Device>, Error> {
    crate::sys::netns::within(netns, || match kind_of(name)? {
        Some(kind) => wg.backend(kind).read(name),
        None => Ok(None),
    })
}

/// Resets peer `spec` of device `name` in `netns` on whichever backend runs it
/// ([`Backend::reset_peer`]). False when there is no such device.
pub fn reset(wg: &Wireguard, netns: Option<&Path>, name: &str, spec: &PeerSpec) -> Result<bool, Error> {
    crate::sys::netns::within(netns, || match kind_of(name)? {
        Some(kind) => wg.backend(kind).reset_peer(name, spec).map(|()| true),
        None => Ok(false),
    })
}

/// The backend of device `name` in the calling thread's namespace, by its link's kind (that
/// link alone is read); None when there is no such link or it is no WireGuard device.
fn kind_of(name: &str) -> Result<Option<BackendKind>, Error> {
    Ok(kernel::link_kind(name)?.and_then(|k| BackendKind::of_link_kind(Some(&k))))
}

impl From<crate::sys::Error> for Error {
    fn from(e: crate::sys::Error) -> Self {
        Error::Device { device: String::new(), op: "entering the namespace", reason: e.to_string() }
    }
}
