use std::net::SocketAddr;

use kuport_proto::channel;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls_pki_types::{ServerName, UnixTime};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn verify(serving: &Pem, ca: &Pem, name: &str) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(first_cert(&ca.cert).unwrap()).unwrap();
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().unwrap();
    let leaf = first_cert(&serving.cert).unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now()).map(|_| ())
}

fn serial(pem: &Pem) -> Vec<u8> {
    serial_of(&first_cert(&pem.cert).unwrap())
}

fn serial_of(der: &CertificateDer<'_>) -> Vec<u8> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.raw_serial().to_vec()
}

#[test]
fn a_serving_certificate_verifies_under_the_server_name_with_its_ca_only() {
    let ca = issue_ca().unwrap();
    let serving = issue_serving(&ca).unwrap();
    verify(&serving, &ca, SERVER_NAME).unwrap();
    let other = issue_ca().unwrap();
    assert!(verify(&serving, &other, SERVER_NAME).is_err());
    assert!(verify(&serving, &ca, "kuport-controller.kuport-system.svc").is_err());
    // The CA itself is no serving certificate.
    assert!(verify(&ca, &ca, SERVER_NAME).is_err());
    assert!(names_server(&serving.cert) && !names_server(&ca.cert));
    // Each issue is a new key and serial, and the pair loads into rustls.
    let again = issue_serving(&ca).unwrap();
    assert_ne!(serial(&serving), serial(&again));
    certified(&serving).unwrap();
    assert!(certified(&Pem { cert: serving.cert.clone(), key: again.key.clone() }).is_err(), "mismatched key");
}

#[test]
fn lifetimes_are_ten_years_and_ninety_days() {
    let now = SystemTime::now();
    let ca = issue_ca().unwrap();
    let serving = issue_serving(&ca).unwrap();
    let near = |t: SystemTime, want: SystemTime| {
        t.duration_since(want).or_else(|_| want.duration_since(t)).unwrap() < 60 * Duration::from_secs(60)
    };
    assert!(near(not_after(&ca.cert).unwrap(), now + CA_LIFETIME));
    assert!(near(not_after(&serving.cert).unwrap(), now + SERVING_LIFETIME));
    assert!(!renewal_due(not_after(&serving.cert).unwrap(), now));
    assert!(renewal_due(not_after(&serving.cert).unwrap(), now + 61 * DAY));
}

#[test]
fn renewal_is_due_with_less_than_thirty_days_left() {
    let now = UNIX_EPOCH + 1000 * DAY;
    assert!(!renewal_due(now + 90 * DAY, now));
    assert!(!renewal_due(now + 30 * DAY, now), "exactly 30 days left: not yet");
    assert!(renewal_due(now + 30 * DAY - Duration::from_secs(1), now));
    assert!(renewal_due(now, now));
    assert!(renewal_due(now - DAY, now), "expired");
}

#[test]
fn a_debug_print_hides_the_key() {
    let ca = issue_ca().unwrap();
    assert!(!format!("{ca:?}").contains("PRIVATE"));
}

/// A health server on Tls::incoming; the reporter flips a service's status for watch streams.
async fn serve(tls: &Tls) -> (SocketAddr, tonic_health::server::HealthReporter) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("kuport", ServingStatus::Serving).await;
    let incoming = tls.incoming(listener, Default::default());
    tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
    (address, reporter)
}

async fn client(address: &str, ca: &Pem) -> Result<HealthClient<tonic::transport::Channel>, String> {
    let channel =
        channel::endpoint(address, Some(ca.cert.as_bytes())).unwrap().connect().await.map_err(|e| format!("{e:?}"))?;
    Ok(HealthClient::new(channel))
}

async fn check(c: &mut HealthClient<tonic::transport::Channel>) -> Result<i32, tonic::Status> {
    Ok(c.check(HealthCheckRequest { service: "kuport".into() }).await?.into_inner().status)
}

/// The leaf a fresh TLS handshake with `address` is given.
async fn peer_leaf(address: SocketAddr, ca: &Pem) -> CertificateDer<'static> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(first_cert(&ca.cert).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address).await.unwrap();
    let tls = connector.connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test]
async fn a_tonic_client_with_the_channel_endpoint_talks_through_incoming() {
    let ca = issue_ca().unwrap();
    let tls = Tls::fixed(&issue_serving(&ca).unwrap()).unwrap();
    let (address, _reporter) = serve(&tls).await;
    let mut c = client(&format!("https://{address}"), &ca).await.unwrap();
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving as i32);
    // Another CA does not verify the server.
    let other = issue_ca().unwrap();
    let refused = match client(&format!("https://{address}"), &other).await {
        Ok(mut c) => check(&mut c).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a client trusting another CA got through");
}

#[tokio::test]
async fn a_plain_text_client_is_refused_and_the_port_keeps_serving() {
    let ca = issue_ca().unwrap();
    let tls = Tls::fixed(&issue_serving(&ca).unwrap()).unwrap();
    let (address, _reporter) = serve(&tls).await;
    let plain = channel::endpoint(&format!("http://{address}"), None).unwrap();
    let refused = match plain.connect().await {
        Ok(ch) => check(&mut HealthClient::new(ch)).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "an h2c client got an answer from the TLS port");
    // A client that never starts its handshake holds nothing up.
    let _idle = TcpStream::connect(address).await.unwrap();
    let mut c = client(&format!("https://{address}"), &ca).await.unwrap();
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving as i32);
}

#[tokio::test]
async fn a_swapped_certificate_reaches_new_handshakes_and_spares_open_streams() {
    let ca = issue_ca().unwrap();
    let first = issue_serving(&ca).unwrap();
    let tls = Tls::fixed(&first).unwrap();
    let (address, reporter) = serve(&tls).await;
    assert_eq!(serial_of(&peer_leaf(address, &ca).await), serial(&first));

    // An open stream from before the swap.
    let mut c = client(&format!("https://{address}"), &ca).await.unwrap();
    let mut watch = c.watch(HealthCheckRequest { service: "kuport".into() }).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::Serving as i32);

    let second = issue_serving(&ca).unwrap();
    tls.replace(&second).unwrap();
    assert_eq!(serial_of(&tls.chain()[0]), serial(&second));
    assert_eq!(serial_of(&peer_leaf(address, &ca).await), serial(&second), "a new handshake gets the new certificate");

    // The stream opened before goes on, on its connection.
    reporter.set_service_status("kuport", ServingStatus::NotServing).await;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::NotServing as i32);
}

#[tokio::test]
async fn a_mounted_certificate_is_re_read_when_its_files_change() {
    let dir = std::env::temp_dir().join(format!("kuport-tls-mounted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = issue_ca().unwrap();
    let first = issue_serving(&ca).unwrap();
    std::fs::write(dir.join(TLS_CRT), &first.cert).unwrap();
    std::fs::write(dir.join(TLS_KEY), &first.key).unwrap();
    let every = Duration::from_millis(20);
    let tls = Tls::mounted(dir.clone(), every).unwrap();
    assert_eq!(serial_of(&tls.chain()[0]), serial(&first));

    // A broken pair is not served; the previous one stays.
    std::fs::write(dir.join(TLS_KEY), "garbage").unwrap();
    tokio::time::sleep(every * 10).await;
    assert_eq!(serial_of(&tls.chain()[0]), serial(&first));

    let second = issue_serving(&ca).unwrap();
    std::fs::write(dir.join(TLS_CRT), &second.cert).unwrap();
    std::fs::write(dir.join(TLS_KEY), &second.key).unwrap();
    tokio::time::sleep(every * 10).await;
    assert_eq!(serial_of(&tls.chain()[0]), serial(&second));
    let _ = std::fs::remove_dir_all(&dir);

    let missing = Tls::start(Source::Mounted(dir.join("none"))).await.unwrap_err().to_string();
    assert!(missing.contains("tls.crt"), "{missing}");
}
