//! The serving certificate of the gRPC port (docs/security.md, "TLS"): an operator's mounted
//! `kubernetes.io/tls` Secret ([`Source::Mounted`]) or kuport's own CA and certificate in the
//! Secret [`TLS_SECRET`] ([`Source::Managed`]), served under [`SERVER_NAME`] by a resolver that
//! swaps the certificate for new handshakes while existing connections stay up.

use prometheus_client::metrics::counter::Counter;
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kuport_proto::channel::SERVER_NAME;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use super::{CA_CONFIGMAP, CA_KEY, TLS_SECRET};

/// The managed CA's life.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The managed serving certificate's life.
pub const SERVING_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// A serving certificate with less than this left is renewed.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often a mounted certificate's files are looked at.
const POLL: Duration = Duration::from_secs(10);
/// How often the managed Secret is read again without a watch event (renewal is due by time).
const RECHECK: Duration = Duration::from_secs(3600);
/// How soon a failed write (the CA ConfigMap, a renewal) is tried again.
const RETRY: Duration = Duration::from_secs(10);
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Certificates are valid from a little before they are made: clocks differ.
const BACKDATE: Duration = Duration::from_secs(3600);
/// The managed Secret's keys (those of cert-manager's Secrets).
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
const CA_PRIVATE: &str = "ca.key";

/// Where the serving certificate comes from.
#[derive(Clone)]
pub enum Source {
    /// An operator's `kubernetes.io/tls` Secret mounted at this folder (`tls.crt`, `tls.key`),
    /// re-read when its files change (polled every 10 s).
    Mounted(PathBuf),
    /// kuport's own CA and serving certificate in the Secret [`TLS_SECRET`] of `namespace`,
    /// created by the first replica, watched by all, renewed by whichever sees it due; the CA is
    /// published in the ConfigMap [`CA_CONFIGMAP`].
    Managed { client: kube::Client, namespace: String },
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Mounted(dir) => f.debug_tuple("Mounted").field(dir).finish(),
            Source::Managed { namespace, .. } => f.debug_struct("Managed").field("namespace", namespace).finish(),
        }
    }
}

/// A certificate (chain, leaf first) and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pem").field("cert", &self.cert).field("key", &"<redacted>").finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("{what}: {reason}")]
    Material { what: String, reason: String },
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
}

fn material(what: impl Into<String>, reason: impl fmt::Display) -> TlsError {
    TlsError::Material { what: what.into(), reason: reason.to_string() }
}

/// The one crypto provider: rustls panics when none or two are installed process-wide, so every
/// config names it explicitly.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

/// A new self-signed CA (ECDSA P-256, 10 years) that may sign end-entity certificates only.
pub fn issue_ca() -> Result<Pem, TlsError> {
    let now = SystemTime::now();
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "kuport");
    name.push(rcgen::DnType::CommonName, "kuport CA");
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset(now - BACKDATE);
    params.not_after = offset(now + CA_LIFETIME);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// A new serving certificate (ECDSA P-256, 90 days, a fresh key) for [`SERVER_NAME`], signed by
/// `ca` (its first certificate and its key).
pub fn issue_serving(ca: &Pem) -> Result<Pem, TlsError> {
    let now = SystemTime::now();
    let ca_key = rcgen::KeyPair::from_pem(&ca.key).map_err(|e| material("the CA key", e))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(|e| material("the CA certificate", e))?;
    let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])?;
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, SERVER_NAME);
    params.distinguished_name = name;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - BACKDATE);
    params.not_after = offset(now + SERVING_LIFETIME);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// Whether a certificate valid until `not_after` is to be renewed at `now`: less than
/// [`RENEW_BEFORE`] (30 days) left, or already expired.
pub fn renewal_due(not_after: SystemTime, now: SystemTime) -> bool {
    not_after.duration_since(now).map_or(true, |left| left < RENEW_BEFORE)
}

/// The end of validity of the first certificate in `cert_pem`.
pub fn not_after(cert_pem: &str) -> Result<SystemTime, TlsError> {
    let secs = not_after_der(&first_cert(cert_pem)?)?;
    Ok(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// The end of validity of a DER certificate, in seconds since the epoch.
fn not_after_der(der: &[u8]) -> Result<i64, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| material("the certificate", e))?;
    Ok(cert.validity().not_after.timestamp())
}

/// Whether the first certificate in `cert_pem` has [`SERVER_NAME`] among its DNS names.
pub fn names_server(cert_pem: &str) -> bool {
    let Ok(der) = first_cert(cert_pem) else { return false };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else { return false };
    let Ok(Some(san)) = cert.subject_alternative_name() else { return false };
    san.value
        .general_names
        .iter()
        .any(|n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if d.eq_ignore_ascii_case(SERVER_NAME)))
}

fn chain(cert_pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| material("the certificate", e))?;
    if certs.is_empty() {
        return Err(material("the certificate", "no PEM certificate"));
    }
    Ok(certs)
}

fn first_cert(cert_pem: &str) -> Result<CertificateDer<'static>, TlsError> {
    chain(cert_pem)?.into_iter().next().ok_or_else(|| material("the certificate", "no PEM certificate"))
}

/// `pem` as rustls serves it; Err when the key does not parse or does not match the certificate.
fn certified(pem: &Pem) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs = chain(&pem.cert)?;
    let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).map_err(|e| material("the private key", e))?;
    let key = CertifiedKey::from_der(certs, key, &provider()).map_err(|e| material("the certificate and key", e))?;
    Ok(Arc::new(key))
}

/// The certificate new handshakes get; replaced whole, so a handshake sees one or the other.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl Current {
    fn get(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = key;
    }
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// Stops the background task when the last [`Tls`] goes.
struct Task(Option<tokio::task::JoinHandle<()>>);

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

struct Inner {
    acceptor: TlsAcceptor,
    current: Arc<Current>,
    _task: Task,
}

/// The gRPC port's TLS: accepts connections ([`Tls::incoming`]) with the current certificate,
/// which its source's background task keeps current.
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads (Managed: creates if absent) the certificate and starts keeping it current.
    pub async fn start(source: Source) -> Result<Tls, TlsError> {
        match source {
            Source::Mounted(dir) => Tls::mounted(dir, POLL),
            Source::Managed { client, namespace } => {
                let managed = Managed::new(client, &namespace);
                let secret = managed.ensure().await?;
                let secret = managed.renew_if_due(secret).await?;
                let pem = serving_of(&secret).map_err(|e| material(managed.secret_name(), e))?;
                let current = Arc::new(Current(RwLock::new(certified(&pem)?)));
                let acceptor = Tls::acceptor(&current)?;
                let published = match managed.publish_ca(&secret).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "publishing the CA; retrying");
                        false
                    }
                };
                let task = tokio::spawn(managed.keep(current.clone(), pem, published));
                Ok(Tls::with(acceptor, current, Some(task)))
            }
        }
    }

    fn mounted(dir: PathBuf, every: Duration) -> Result<Tls, TlsError> {
        let (pem, seen) = read_mounted(&dir)?;
        let current = Arc::new(Current(RwLock::new(certified(&pem)?)));
        warn_if_due(&pem, &format!("the certificate in {}", dir.display()));
        let acceptor = Tls::acceptor(&current)?;
        let task = tokio::spawn(poll_mounted(dir, every, current.clone(), seen));
        Ok(Tls::with(acceptor, current, Some(task)))
    }

    /// A fixed certificate, never renewed (tests, tools).
    pub fn fixed(pem: &Pem) -> Result<Tls, TlsError> {
        let current = Arc::new(Current(RwLock::new(certified(pem)?)));
        Ok(Tls::with(Tls::acceptor(&current)?, current, None))
    }

    fn acceptor(current: &Arc<Current>) -> Result<TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| material("the TLS configuration", e))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    fn with(acceptor: TlsAcceptor, current: Arc<Current>, task: Option<tokio::task::JoinHandle<()>>) -> Tls {
        Tls { inner: Arc::new(Inner { acceptor, current, _task: Task(task) }) }
    }

    /// Serves `pem` on new handshakes from now on; connections already up keep theirs.
    pub fn replace(&self, pem: &Pem) -> Result<(), TlsError> {
        self.inner.current.set(certified(pem)?);
        Ok(())
    }

    /// When the certificate new handshakes get ends, in seconds since the epoch (for the
    /// metrics: it changes when the certificate is renewed or the mounted one replaced).
    pub fn not_after(&self) -> Option<i64> {
        not_after_der(self.inner.current.get().cert.first()?).ok()
    }

    /// The chain new handshakes get (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.inner.current.get().cert.clone()
    }

    /// The TLS connections accepted on `listener`, for `serve_with_incoming`. Handshakes run
    /// concurrently, each given 10 s; one that fails is logged at debug, counted on `refused`
    /// and skipped (a plain-text client is refused here), never ending the stream. ALPN h2,
    /// TCP_NODELAY. The listener closes when the stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
        refused: Counter,
    ) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(64);
        let acceptor = self.inner.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors and the like: wait instead of spinning.
                            tracing::debug!(error = %e, "accepting a connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = tx.closed() => return,
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx, refused) = (acceptor.clone(), tx.clone(), refused.clone());
                tokio::spawn(async move {
                    match handshake(&acceptor, tcp, peer).await {
                        Some(tls) => {
                            let _ = tx.send(Ok(tls)).await;
                        }
                        None => {
                            refused.inc();
                        }
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

async fn handshake(acceptor: &TlsAcceptor, tcp: TcpStream, peer: SocketAddr) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// Warns about what clients will refuse (an operator's certificate without the fixed name) or
/// soon should (less than 30 days left: a mounted one is renewed by its issuer, not here).
fn warn_if_due(pem: &Pem, what: &str) {
    if !names_server(&pem.cert) {
        tracing::warn!("{what} does not name {SERVER_NAME}: clients will refuse it");
    }
    match not_after(&pem.cert) {
        Ok(end) if renewal_due(end, SystemTime::now()) => {
            let left = end.duration_since(SystemTime::now()).map_or(0, |d| d.as_secs() / 86_400);
            tracing::warn!(days_left = left, "{what} is due for renewal");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "{what}"),
    }
}

// ---- Mounted ----

/// The bytes of tls.crt and tls.key as last read (compared to notice a change).
type Seen = (Vec<u8>, Vec<u8>);

/// The mounted pair and the bytes it was read from.
fn read_mounted(dir: &Path) -> Result<(Pem, Seen), TlsError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| TlsError::Read { path, source })
    };
    let (cert, key) = (read(TLS_CRT)?, read(TLS_KEY)?);
    let text = |b: &[u8], name: &str| {
        String::from_utf8(b.to_vec()).map_err(|_| material(dir.join(name).display().to_string(), "not UTF-8 PEM"))
    };
    let pem = Pem { cert: text(&cert, TLS_CRT)?, key: text(&key, TLS_KEY)? };
    Ok((pem, (cert, key)))
}

async fn poll_mounted(dir: PathBuf, every: Duration, current: Arc<Current>, mut seen: Seen) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The kubelet swaps a Secret volume's files at once (a symlink): a read sees old or new.
        let read = read_mounted(&dir);
        match read {
            Ok((pem, bytes)) if bytes != seen => {
                seen = bytes;
                match certified(&pem) {
                    Ok(key) => {
                        current.set(key);
                        tracing::info!(dir = %dir.display(), "serving the changed certificate");
                        warn_if_due(&pem, &format!("the certificate in {}", dir.display()));
                    }
                    Err(e) => tracing::warn!(error = %e, dir = %dir.display(), "keeping the previous certificate"),
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "re-reading the mounted certificate"),
        }
    }
}

// ---- Managed ----

/// The serving pair in a Secret.
fn serving_of(secret: &Secret) -> Result<Pem, String> {
    Ok(Pem { cert: text_of(secret, TLS_CRT)?, key: text_of(secret, TLS_KEY)? })
}

/// The CA pair in a Secret; Err without ca.key (not ours: cannot renew).
fn ca_of(secret: &Secret) -> Result<Pem, String> {
    Ok(Pem { cert: text_of(secret, CA_CRT)?, key: text_of(secret, CA_PRIVATE)? })
}

fn text_of(secret: &Secret, key: &str) -> Result<String, String> {
    let bytes = secret.data.as_ref().and_then(|d| d.get(key)).ok_or_else(|| format!("no {key}"))?;
    String::from_utf8(bytes.0.clone()).map_err(|_| format!("{key} is not UTF-8 PEM"))
}

/// Whether the Secret's serving certificate is missing, unreadable, or has less than 30 days.
fn due(secret: &Secret, now: SystemTime) -> bool {
    let pem = match serving_of(secret) {
        Ok(p) => p,
        Err(_) => return true,
    };
    match not_after(&pem.cert) {
        Ok(end) => renewal_due(end, now) || certified(&pem).is_err(),
        Err(_) => true,
    }
}

fn kube_err(what: String) -> impl FnOnce(kube::Error) -> TlsError {
    move |source| TlsError::Kube { what, source }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists())
}

struct Managed {
    secrets: kube::Api<Secret>,
    configmaps: kube::Api<ConfigMap>,
    namespace: String,
}

impl Managed {
    fn new(client: kube::Client, namespace: &str) -> Self {
        Managed {
            secrets: kube::Api::namespaced(client.clone(), namespace),
            configmaps: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    fn secret_name(&self) -> String {
        format!("Secret {}/{TLS_SECRET}", self.namespace)
    }

    /// The Secret; created with a new CA and serving certificate if absent. A replica that
    /// loses the race to create it reads the winner's back.
    async fn ensure(&self) -> Result<Secret, TlsError> {
        let name = self.secret_name();
        if let Some(s) = self.secrets.get_opt(TLS_SECRET).await.map_err(kube_err(format!("reading {name}")))? {
            return Ok(s);
        }
        let ca = issue_ca()?;
        let serving = issue_serving(&ca)?;
        let data = BTreeMap::from([
            (CA_CRT.to_string(), ByteString(ca.cert.into_bytes())),
            (CA_PRIVATE.to_string(), ByteString(ca.key.into_bytes())),
            (TLS_CRT.to_string(), ByteString(serving.cert.into_bytes())),
            (TLS_KEY.to_string(), ByteString(serving.key.into_bytes())),
        ]);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(TLS_SECRET.to_string()),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "kuport".to_string())])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(data),
            ..Default::default()
        };
        match self.secrets.create(&PostParams::default(), &secret).await {
            Ok(s) => {
                tracing::info!(secret = %name, "created the CA and the serving certificate");
                Ok(s)
            }
            Err(e) if is_conflict(&e) => {
                tracing::info!(secret = %name, "another replica created the certificate; using it");
                self.secrets.get(TLS_SECRET).await.map_err(kube_err(format!("reading {name}")))
            }
            Err(e) => Err(kube_err(format!("creating {name}"))(e)),
        }
    }

    /// `secret` with a new serving certificate when due, or as it is. The update is made at the
    /// read resourceVersion: a conflict means another replica renewed (or changed) it, and the
    /// Secret is read again. Err only when the certificate is unusable and cannot be renewed
    /// (a usable one is served still, with a warning).
    async fn renew_if_due(&self, secret: Secret) -> Result<Secret, TlsError> {
        let name = self.secret_name();
        if !due(&secret, SystemTime::now()) {
            return Ok(secret);
        }
        let usable = serving_of(&secret).ok().and_then(|p| certified(&p).ok()).is_some();
        let ca = match ca_of(&secret) {
            Ok(ca) => ca,
            Err(reason) if usable => {
                tracing::warn!(secret = %name, reason, "the serving certificate is due but cannot be renewed here");
                return Ok(secret);
            }
            Err(reason) => return Err(material(format!("{name}: cannot issue a serving certificate"), reason)),
        };
        let serving = issue_serving(&ca)?;
        let mut renewed = secret.clone();
        let data = renewed.data.get_or_insert_with(BTreeMap::new);
        data.insert(TLS_CRT.to_string(), ByteString(serving.cert.into_bytes()));
        data.insert(TLS_KEY.to_string(), ByteString(serving.key.into_bytes()));
        match self.secrets.replace(TLS_SECRET, &PostParams::default(), &renewed).await {
            Ok(s) => {
                tracing::info!(secret = %name, "renewed the serving certificate");
                Ok(s)
            }
            Err(e) if is_conflict(&e) => {
                tracing::info!(secret = %name, "the Secret changed meanwhile (another replica renewed it)");
                self.secrets.get(TLS_SECRET).await.map_err(kube_err(format!("reading {name}")))
            }
            // A certificate that still serves is kept: a refused update must not stop the port.
            Err(e) if usable => {
                tracing::warn!(secret = %name, error = %e, "the serving certificate is due but the renewal was refused; serving it still");
                Ok(secret)
            }
            Err(e) => Err(kube_err(format!("renewing {name}"))(e)),
        }
    }

    /// Makes the ConfigMap's CA bundle the Secret's ca.crt (nothing to do without one).
    async fn publish_ca(&self, secret: &Secret) -> Result<(), TlsError> {
        let Ok(ca) = text_of(secret, CA_CRT) else { return Ok(()) };
        let name = format!("ConfigMap {}/{CA_CONFIGMAP}", self.namespace);
        let existing = self.configmaps.get_opt(CA_CONFIGMAP).await.map_err(kube_err(format!("reading {name}")))?;
        let Some(mut cm) = existing else {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CA_CONFIGMAP.to_string()),
                    labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "kuport".to_string())])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(CA_KEY.to_string(), ca)])),
                ..Default::default()
            };
            return match self.configmaps.create(&PostParams::default(), &cm).await {
                Ok(_) => {
                    tracing::info!(configmap = %name, "published the CA");
                    Ok(())
                }
                // Another replica did; the next change or recheck compares.
                Err(e) if is_conflict(&e) => Ok(()),
                Err(e) => Err(kube_err(format!("creating {name}"))(e)),
            };
        };
        if cm.data.as_ref().and_then(|d| d.get(CA_KEY)) == Some(&ca) {
            return Ok(());
        }
        cm.data.get_or_insert_with(BTreeMap::new).insert(CA_KEY.to_string(), ca);
        match self.configmaps.replace(CA_CONFIGMAP, &PostParams::default(), &cm).await {
            Ok(_) => {
                tracing::info!(configmap = %name, "published the changed CA");
                Ok(())
            }
            Err(e) => Err(kube_err(format!("updating {name}"))(e)),
        }
    }

    /// One look at the Secret: renew if due, serve what it holds if it changed, publish its CA.
    /// Returns whether every write worked.
    async fn tend(&self, secret: Secret, current: &Current, served: &mut Pem) -> bool {
        let secret = match self.renew_if_due(secret).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "renewing the serving certificate");
                return false;
            }
        };
        match serving_of(&secret) {
            Ok(pem) if pem != *served => match certified(&pem) {
                Ok(key) => {
                    current.set(key);
                    tracing::info!(secret = %self.secret_name(), "serving the changed certificate");
                    if !names_server(&pem.cert) {
                        tracing::warn!(secret = %self.secret_name(), "the certificate does not name {SERVER_NAME}: clients will refuse it");
                    }
                    *served = pem;
                }
                Err(e) => tracing::warn!(error = %e, "keeping the previous certificate"),
            },
            Ok(_) => {}
            Err(reason) => tracing::warn!(secret = %self.secret_name(), reason, "keeping the previous certificate"),
        }
        match self.publish_ca(&secret).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "publishing the CA");
                false
            }
        }
    }

    /// Watches the Secret (every replica swaps at once), and reads it hourly (renewal is due by
    /// time alone), or after RETRY while a write failed.
    async fn keep(self, current: Arc<Current>, mut served: Pem, mut ok: bool) {
        let fields = format!("metadata.name={TLS_SECRET}");
        let mut events =
            std::pin::pin!(watcher(self.secrets.clone(), watcher::Config::default().fields(&fields)).default_backoff());
        loop {
            let wait = if ok { RECHECK } else { RETRY };
            let secret = tokio::select! {
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s))) => Some(s),
                    Some(Ok(watcher::Event::Delete(_))) => {
                        tracing::warn!(secret = %self.secret_name(), "the Secret was deleted; creating it again");
                        None
                    }
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => continue,
                    Some(Err(e)) => {
                        // Warn: a refused watch (RBAC) would otherwise hide rotation failing.
                        tracing::warn!(error = %e, "watching the TLS Secret");
                        continue;
                    }
                    None => return,
                },
                _ = tokio::time::sleep(wait) => None,
            };
            let secret = match secret {
                Some(s) => s,
                None => match self.ensure().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the TLS Secret");
                        ok = false;
                        continue;
                    }
                },
            };
            ok = self.tend(secret, &current, &mut served).await;
        }
    }
}

#[cfg(test)]
mod tests;
