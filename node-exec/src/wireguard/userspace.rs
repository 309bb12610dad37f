//! The userspace backend: `wireguard-go -f IFACE` run inside the device's namespace and
//! configured over its UAPI socket ([`super::uapi`]). The daemon makes the link (a `tun`
//! device) and takes it away when it ends; deleting the link ends the daemon.
//!
//! Supervision: a thread per daemon reaps it and logs how it ended. The link goes with it, so
//! the executor's keep loop hears the link go (rtnetlink) and its repair starts the daemon
//! again, configured whole. A daemon outlives the executor (as a kernel device would): a
//! restarted executor finds its link and socket and carries on with it.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::model::{Device, DeviceConfig, PeerChange};
use super::{Backend, BackendKind, Error, kernel, uapi};

/// Where wireguard-go puts its UAPI sockets (ipc/uapi_linux.go: socketDirectory).
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long a new daemon may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the reaper looks at its daemon.
const REAP_EVERY: Duration = Duration::from_millis(100);

/// A daemon this process started.
#[derive(Debug)]
struct Daemon {
    child: Arc<Mutex<Child>>,
    pid: u32,
}

/// wireguard-go devices, by interface name.
#[derive(Debug)]
pub struct Userspace {
    binary: PathBuf,
    socket_dir: PathBuf,
    daemons: Arc<Mutex<BTreeMap<String, Daemon>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Userspace {
    pub fn new(binary: PathBuf, socket_dir: PathBuf) -> Self {
        Userspace { binary, socket_dir, daemons: Arc::default() }
    }

    /// The UAPI socket of device `name`.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.socket_dir.join(format!("{name}.sock"))
    }

    /// The daemons started here that still run.
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.daemons).values().map(|d| d.pid).collect()
    }

    fn exchange(&self, name: &str, op: &'static str, request: &str) -> Result<String, Error> {
        uapi::exchange(&self.socket(name), request).map_err(|e| Error::device(name, op, e))
    }

    /// Starts the daemon in `netns` and waits until it answers on its socket.
    fn start(&self, netns: Option<&Path>, name: &str) -> Result<(), Error> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("-f").arg(name).env("WG_PROCESS_FOREGROUND", "1");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(ns) = crate::sys::netns::open(netns)? {
            ns.command(&mut cmd)?;
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::device(name, "starting wireguard-go", format!("{}: {e}", self.binary.display())))?;
        let pid = child.id();
        let output = Arc::new(Mutex::new(Vec::<String>::new()));
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let (output, device) = (Arc::clone(&output), name.to_string());
            let _ = std::thread::Builder::new().name("kuport-wg-log".into()).spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    tracing::debug!(device, pid, "wireguard-go: {line}");
                    let mut o = lock(&output);
                    if o.len() < 40 {
                        o.push(line);
                    }
                }
            });
        }
        let child = Arc::new(Mutex::new(child));
        lock(&self.daemons).insert(name.to_string(), Daemon { child: Arc::clone(&child), pid });
        let (daemons, device) = (Arc::clone(&self.daemons), name.to_string());
        let reaper = Arc::clone(&child);
        let _ = std::thread::Builder::new().name("kuport-wg-reap".into()).spawn(move || {
            loop {
                let status = lock(&reaper).try_wait();
                match status {
                    Ok(None) => std::thread::sleep(REAP_EVERY),
                    Ok(Some(status)) => {
                        tracing::warn!(device, pid, %status, "wireguard-go ended; its link went with it");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(device, pid, error = %e, "wireguard-go: waiting for it failed");
                        break;
                    }
                }
            }
            let mut all = lock(&daemons);
            if all.get(&device).is_some_and(|d| d.pid == pid) {
                all.remove(&device);
            }
        });
        let started = Instant::now();
        let socket = self.socket(name);
        loop {
            if let Ok(answer) = uapi::exchange(&socket, uapi::GET)
                && uapi::errno(&answer) == Ok(0)
            {
                return Ok(());
            }
            let ended = lock(&child).try_wait().ok().flatten();
            if ended.is_some() || started.elapsed() > START_TIMEOUT {
                let _ = lock(&child).kill();
                let said = lock(&output).join("; ");
                let how = ended.map_or_else(
                    || format!("no answer on {} within {START_TIMEOUT:?}", socket.display()),
                    |s| format!("it ended ({s})"),
                );
                return Err(Error::device(name, "starting wireguard-go", format!("{how}: {said}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Backend for Userspace {
    fn kind(&self) -> BackendKind {
        BackendKind::Userspace
    }

    fn create(&self, netns: Option<&Path>, name: &str) -> Result<(), Error> {
        let socket = self.socket(name);
        if socket.exists() {
            // Called when the namespace has no such link: a live socket is another namespace's
            // device of the same name (one folder for the node); a dead one is a leftover.
            if uapi::exchange(&socket, uapi::GET).is_ok() {
                return Err(Error::device(
                    name,
                    "starting wireguard-go",
                    format!("{} answers already: another namespace has a device of this name", socket.display()),
                ));
            }
            let _ = std::fs::remove_file(&socket);
        }
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::device(name, "making the socket folder", e))?;
        }
        self.start(netns, name)
    }

    fn read(&self, name: &str) -> Result<Option<Device>, Error> {
        let socket = self.socket(name);
        let answer = match uapi::exchange(&socket, uapi::GET) {
            Ok(a) => a,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
                return Ok(None);
            }
            Err(e) => return Err(Error::device(name, "get", e)),
        };
        uapi::parse_get(&answer).map(Some).map_err(|e| Error::device(name, "get", e))
    }

    fn configure(&self, name: &str, config: &DeviceConfig) -> Result<(), Error> {
        if config.is_empty() {
            return Ok(());
        }
        set(self.exchange(name, "set device", &uapi::set_request(config, &[]))?, name, "set device")
    }

    fn apply_peers(&self, name: &str, changes: &[PeerChange]) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        let request = uapi::set_request(&DeviceConfig::default(), changes);
        set(self.exchange(name, "set peers", &request)?, name, "set peers")
    }

    fn delete(&self, name: &str) -> Result<(), Error> {
        // Deleting the tun link ends the daemon, which removes its socket.
        let deleted = kernel::delete_link(name);
        let daemon = lock(&self.daemons).remove(name);
        if let Some(d) = daemon {
            let started = Instant::now();
            while lock(&d.child).try_wait().ok().flatten().is_none() {
                if started.elapsed() > Duration::from_secs(2) {
                    let _ = lock(&d.child).kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        deleted
    }
}

fn set(answer: String, name: &str, op: &'static str) -> Result<(), Error> {
    match uapi::errno(&answer) {
        Ok(0) => Ok(()),
        Ok(n) => Err(Error::device(name, op, std::io::Error::from_raw_os_error(n))),
        Err(e) => Err(Error::device(name, op, e)),
    }
}
