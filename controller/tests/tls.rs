//! The managed serving certificate on a real API server (etcd and kube-apiserver from
//! e2e/controlplane): two replicas in one process end with one CA and one certificate in the
//! Secret, the CA is published in the ConfigMap, and a certificate written into the Secret (as
//! cert-manager would, or a renewal) reaches new handshakes within seconds while an open stream
//! stays up. docs/security.md, "TLS".

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PostParams;
use kuport_controller::trust::tls::{Pem, Source, Tls, issue_serving, not_after, renewal_due};
use kuport_controller::trust::{CA_CONFIGMAP, CA_KEY, TLS_SECRET};
use kuport_proto::channel::{self, SERVER_NAME};
use rustls::client::danger::ServerCertVerifier as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::{TcpListener, TcpStream};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const NAMESPACE: &str = "kuport-system";

async fn client(cp: &ControlPlane) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&cp.kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    kube::Client::try_from(cfg).unwrap()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

fn roots(ca_pem: &str) -> Arc<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca_pem)).unwrap();
    Arc::new(roots)
}

/// The leaf a fresh handshake with `address` gets, verified with `ca_pem` as SERVER_NAME.
async fn peer_leaf(address: SocketAddr, ca_pem: &str) -> CertificateDer<'static> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca_pem))
        .with_no_client_auth();
    let tcp = TcpStream::connect(address).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// Waits until every replica serves `leaf`.
async fn until_served(replicas: &[&Tls], leaf: &CertificateDer<'_>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replicas.iter().all(|t| t.chain()[0] == *leaf) {
        assert!(Instant::now() < deadline, "{what}: not served within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A serving certificate signed by `ca` that ends in `days` (a renewal due soon).
fn short_lived(ca: &Pem, days: u64) -> Pem {
    let key = rcgen::KeyPair::from_pem(&ca.key).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert, key).unwrap();
    let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days as i64);
    params.use_authority_key_identifier_extension = true;
    let leaf = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&leaf, &issuer).unwrap();
    Pem { cert: cert.pem(), key: leaf.serialize_pem() }
}

/// Writes a serving pair into the Secret, as cert-manager would.
async fn write_serving(secrets: &kube::Api<Secret>, pem: &Pem) {
    let mut s = secrets.get(TLS_SECRET).await.unwrap();
    let data = s.data.as_mut().unwrap();
    data.insert("tls.crt".into(), ByteString(pem.cert.clone().into_bytes()));
    data.insert("tls.key".into(), ByteString(pem.key.clone().into_bytes()));
    secrets.replace(TLS_SECRET, &PostParams::default(), &s).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_managed_certificate_and_follow_the_secret() {
    let cp = ControlPlane::up("tls");
    cp.ok(&["create", "namespace", NAMESPACE], None);
    let client = client(&cp).await;
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let configmaps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let managed = || Source::Managed { client: client.clone(), namespace: NAMESPACE.to_string() };

    // 1. Two replicas start at once: one creates the Secret, the other reads it back.
    let (a, b) = tokio::join!(Tls::start(managed()), Tls::start(managed()));
    let (a, b) = (a.unwrap(), b.unwrap());
    let secret = secrets.get(TLS_SECRET).await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca = Pem { cert: text(&secret, "ca.crt"), key: text(&secret, "ca.key") };
    let leaf = der(&text(&secret, "tls.crt"));
    assert_eq!(a.chain()[0], leaf, "replica a serves the Secret's certificate");
    assert_eq!(b.chain()[0], leaf, "replica b serves the Secret's certificate");
    let lifetime = not_after(&text(&secret, "tls.crt")).unwrap().duration_since(SystemTime::now()).unwrap();
    assert!(lifetime > Duration::from_secs(89 * 86_400), "{lifetime:?}");
    // It verifies as SERVER_NAME under the Secret's CA.
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(&ca.cert), provider()).build().unwrap();
    verifier.verify_server_cert(&leaf, &[], &ServerName::try_from(SERVER_NAME).unwrap(), &[], UnixTime::now()).unwrap();

    // 2. The CA is published for executors and kuportctl.
    let cm = configmaps.get(CA_CONFIGMAP).await.unwrap();
    assert_eq!(cm.data.as_ref().unwrap()[CA_KEY], ca.cert);

    // 3. A client that trusts the ConfigMap's CA talks to replica a through Tls::incoming, and
    //    keeps a stream open.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("kuport", ServingStatus::Serving).await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(a.incoming(listener, Default::default())),
    );
    let bundle = cm.data.as_ref().unwrap()[CA_KEY].clone();
    let conn =
        channel::endpoint(&format!("https://{address}"), Some(bundle.as_bytes())).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(conn);
    let mut watch = health.watch(HealthCheckRequest { service: "kuport".into() }).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::Serving as i32);

    // 4. A new certificate from the same CA written into the Secret (cert-manager's way) reaches
    //    both replicas and new handshakes within seconds.
    let replaced = issue_serving(&ca).unwrap();
    write_serving(&secrets, &replaced).await;
    until_served(&[&a, &b], &der(&replaced.cert), "the replaced certificate").await;
    assert_eq!(peer_leaf(address, &bundle).await, der(&replaced.cert));
    // The stream opened before the swap goes on, on its connection.
    reporter.set_service_status("kuport", ServingStatus::NotServing).await;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);

    // 5. A certificate with 10 days left is renewed by one replica (the other's update
    //    conflicts) and both serve the renewal.
    let soon = short_lived(&ca, 10);
    write_serving(&secrets, &soon).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        let s = secrets.get(TLS_SECRET).await.unwrap();
        let cert = text(&s, "tls.crt");
        if cert != soon.cert && !renewal_due(not_after(&cert).unwrap(), SystemTime::now()) {
            break cert;
        }
        assert!(Instant::now() < deadline, "not renewed within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text(&secrets.get(TLS_SECRET).await.unwrap(), "ca.crt"), ca.cert, "the CA stays");
    until_served(&[&a, &b], &der(&renewed), "the renewed certificate").await;
    assert_eq!(peer_leaf(address, &bundle).await, der(&renewed));

    // 6. A restarted replica serves the same certificate (no new CA).
    let c = Tls::start(managed()).await.unwrap();
    assert_eq!(c.chain()[0], der(&renewed));
    assert_eq!(configmaps.get(CA_CONFIGMAP).await.unwrap().data.unwrap()[CA_KEY], ca.cert);
}
