//! Trust on the gRPC port: the serving certificate ([`tls`]), the executors' node-bound identity
//! ([`identity`]) and Debug's authorization by Kubernetes RBAC ([`access`]). docs/security.md.

pub mod access;
pub mod identity;
pub mod tls;

/// The audience of the executors' projected ServiceAccount tokens.
pub const EXECUTOR_AUDIENCE: &str = "kuport.wlz.li/node-exec";
/// The Secret holding the managed CA and serving certificate (type kubernetes.io/tls).
pub const TLS_SECRET: &str = "kuport-controller-tls";
/// The ConfigMap publishing the CA bundle for executors and kuportctl.
pub const CA_CONFIGMAP: &str = "kuport-ca";
/// The CA bundle's key in [`CA_CONFIGMAP`].
pub const CA_KEY: &str = "ca.crt";
