//! How a client reaches the controller: the scheme of the address decides TLS (`https://`, verified
//! against a CA bundle under [`SERVER_NAME`]) or plain text (`http://`, the insecure folder mode
//! only), and every call carries `authorization: Bearer <token>` ([`authorize`]). docs/security.md.

use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// The one name the controller's serving certificate carries and every client verifies, whatever
/// address it dials: a NotLeader redirect to a pod address verifies without per-pod certificates.
pub const SERVER_NAME: &str = "controller.kuport.internal";

/// The largest message an executor decodes, and so the largest node state the controller sends
/// (it refuses a larger one and reports it instead): 32 MiB is 3.6 times a 50,000-mapping node's
/// state (8.8 MB), and buffered and decoded it stays within the executor's 256 Mi memory limit
/// in the chart (docs/decisions.md, "The executor's limits").
pub const MAX_STATE_MESSAGE: usize = 32 * 1024 * 1024;

/// The size of `state` on the stream: encoded as a ControllerMessage, whose limit is
/// [`MAX_STATE_MESSAGE`].
pub fn state_message_len(state: &crate::v1::DesiredState) -> usize {
    prost::encoding::message::encoded_len(1, state)
}

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 keepalive: a ping every 10 s, the connection dropped after 10 s without an answer.
const KEEPALIVE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(
        "controller address {address:?} has no scheme: use https://HOST:PORT (TLS, with a CA bundle) \
         or http://HOST:PORT (plain text, the insecure folder mode on loopback only)"
    )]
    NoScheme { address: String },
    #[error("controller address {address:?}: scheme {scheme:?} is neither https nor http")]
    Scheme { address: String, scheme: String },
    #[error("controller address {address:?} is https but no CA bundle was given (--ca-file)")]
    NoCa { address: String },
    #[error("CA bundle for {address:?}: {reason}")]
    Ca { address: String, reason: String },
    #[error("controller address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("bearer token: {reason}")]
    Token { reason: &'static str },
}

/// An Endpoint for `address`: "https://h:p" needs `ca_pem` (PEM, one or more certificates) and
/// verifies the server as [`SERVER_NAME`]; "http://h:p" is plain text (`ca_pem` unused); an
/// address without a scheme is an error naming both choices. Connect timeout 3 s, HTTP/2
/// keepalive 10 s / 10 s. Nothing is dialled here.
pub fn endpoint(address: &str, ca_pem: Option<&[u8]>) -> Result<Endpoint, ChannelError> {
    let Some((scheme, _)) = address.split_once("://") else {
        return Err(ChannelError::NoScheme { address: address.to_string() });
    };
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return Err(ChannelError::Scheme { address: address.to_string(), scheme: scheme.to_string() }),
    };
    let invalid =
        |e: tonic::transport::Error| ChannelError::Address { address: address.to_string(), reason: e.to_string() };
    let mut endpoint = Endpoint::from_shared(address.to_string())
        .map_err(invalid)?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE);
    if tls {
        let Some(pem) = ca_pem else {
            return Err(ChannelError::NoCa { address: address.to_string() });
        };
        check_bundle(pem).map_err(|reason| ChannelError::Ca { address: address.to_string(), reason })?;
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(SERVER_NAME);
        endpoint = endpoint.tls_config(config).map_err(invalid)?;
    }
    Ok(endpoint)
}

/// A bundle must hold at least one parsable certificate: tonic would only fail at connect, with
/// a vaguer message.
fn check_bundle(pem: &[u8]) -> Result<(), String> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| format!("not PEM certificates: {e}"))?;
        count += 1;
    }
    if count == 0 { Err("holds no PEM certificate".to_string()) } else { Ok(()) }
}

/// Adds `authorization: Bearer <token>` (the token trimmed: a file's trailing newline is not
/// part of it). Err if the token is empty or not a valid header value; the token is never in the
/// error.
pub fn authorize<T>(request: &mut tonic::Request<T>, token: &str) -> Result<(), ChannelError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ChannelError::Token { reason: "empty" });
    }
    let value: MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| ChannelError::Token { reason: "not a valid header value (control or non-ASCII characters)" })?;
    request.metadata_mut().insert("authorization", value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> String {
        rcgen::generate_simple_self_signed(vec!["t".to_string()]).unwrap().cert.pem()
    }

    #[test]
    fn https_needs_a_ca_and_verifies_the_fixed_name() {
        let e = endpoint("https://10.0.0.1:9443", None).unwrap_err();
        assert!(e.to_string().contains("no CA bundle"), "{e}");
        let ep = endpoint("https://10.0.0.1:9443", Some(ca().as_bytes())).unwrap();
        assert_eq!(ep.uri().to_string(), "https://10.0.0.1:9443/");
    }

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        let e = endpoint("https://h:1", Some(b"nothing here")).unwrap_err();
        assert!(matches!(e, ChannelError::Ca { .. }), "{e}");
        assert!(e.to_string().contains("\"https://h:1\""), "{e}");
    }

    #[test]
    fn http_is_plain_and_ignores_a_ca() {
        assert!(endpoint("http://127.0.0.1:9443", None).is_ok());
        assert!(endpoint("http://127.0.0.1:9443", Some(b"x")).is_ok());
    }

    #[test]
    fn no_scheme_names_both_choices() {
        let e = endpoint("127.0.0.1:9443", None).unwrap_err().to_string();
        assert!(
            e.contains("https://HOST:PORT") && e.contains("http://HOST:PORT") && e.contains("127.0.0.1:9443"),
            "{e}"
        );
        let e = endpoint("ftp://h:1", None).unwrap_err().to_string();
        assert!(e.contains("\"ftp\""), "{e}");
    }

    #[test]
    fn authorize_sets_a_trimmed_bearer() {
        let mut req = tonic::Request::new(());
        authorize(&mut req, "  abc.def\n").unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer abc.def");
    }

    #[test]
    fn authorize_refuses_empty_and_invalid_tokens_without_echoing_them() {
        let mut req = tonic::Request::new(());
        assert!(matches!(authorize(&mut req, " \n"), Err(ChannelError::Token { reason: "empty" })));
        let e = authorize(&mut req, "sec\u{7}ret").unwrap_err().to_string();
        assert!(!e.contains("sec"), "{e}");
        assert!(req.metadata().get("authorization").is_none());
    }
}
