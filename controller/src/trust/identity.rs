//! Executors prove their node: the bearer token on a NodeSync stream is a projected
//! ServiceAccount token bound to the executor's Pod; a TokenReview for kuport's audience says
//! whose it is and, since Kubernetes 1.32, on which node that Pod runs
//! (`authentication.kubernetes.io/node-name`). docs/security.md.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tonic::metadata::MetadataMap;

/// The user.extra key a pod-bound token's review carries its node in.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The API group Debug's SubjectAccessReviews ask about.
pub const API_GROUP: &str = "kuport.wlz.li";
/// How long an accepted token's review is reused (at most until the token expires).
pub const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long a refused token's review is reused: a retry loop costs no review per attempt.
pub const REFUSED_FOR: Duration = Duration::from_secs(5);
/// Reviews remembered at most (the oldest goes first).
pub const CACHE_ENTRIES: usize = 10_000;
/// Reviews in flight at most: a failover's reconnect storm queues here, not at the API server.
pub const CONCURRENT_REVIEWS: usize = 32;
/// Longer bearer tokens are refused unread (a projected token is about 1 KiB).
const MAX_TOKEN: usize = 16 * 1024;

/// What a TokenReview said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reviewed {
    pub authenticated: bool,
    /// The API server's reason when not authenticated.
    pub error: String,
    pub audiences: Vec<String>,
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// One access a SubjectAccessReview asks about (group [`API_GROUP`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// What a SubjectAccessReview said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// A review the API server did not answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(pub String);

/// Asks the API server who a token is and what it may do; [`KubeReviewer`] in production.
pub trait Reviewer: Send + Sync {
    fn token_review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<Reviewed, ReviewError>>;
    fn access_review<'a>(
        &'a self,
        user: &'a Reviewed,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, ReviewError>>;
}

/// TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1)
/// with the controller's client: RBAC needs `create` on both.
pub struct KubeReviewer(pub kube::Client);

impl Reviewer for KubeReviewer {
    fn token_review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<Reviewed, ReviewError>> {
        Box::pin(async move {
            let api: Api<TokenReview> = Api::all(self.0.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
                },
                ..Default::default()
            };
            let done = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError(format!("TokenReview: {e}")))?;
            let status = done.status.unwrap_or_default();
            let user = status.user.unwrap_or_default();
            Ok(Reviewed {
                authenticated: status.authenticated.unwrap_or(false),
                error: status.error.unwrap_or_default(),
                audiences: status.audiences.unwrap_or_default(),
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            })
        })
    }

    fn access_review<'a>(
        &'a self,
        user: &'a Reviewed,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, ReviewError>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.0.clone());
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.username.clone()),
                    uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                    groups: Some(user.groups.clone()),
                    extra: Some(user.extra.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(API_GROUP.into()),
                        resource: Some(access.resource.clone()),
                        verb: Some(access.verb.clone()),
                        namespace: access.namespace.clone(),
                        name: access.name.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let done = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError(format!("SubjectAccessReview: {e}")))?;
            let status = done.status.unwrap_or_default();
            let reason = [status.reason, status.evaluation_error].into_iter().flatten().collect::<Vec<_>>().join("; ");
            Ok(Decision { allowed: status.allowed && status.denied != Some(true), reason })
        })
    }
}

/// Why a stream or call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Unauthenticated,
    PermissionDenied,
    /// The review itself failed (the API server): the caller may retry.
    Unavailable,
}

/// Reasons, each a metric label (`kuport_executor_refusals_total{reason}`).
pub mod reason {
    pub const NO_TOKEN: &str = "no_token";
    pub const INVALID_TOKEN: &str = "invalid_token";
    pub const WRONG_AUDIENCE: &str = "wrong_audience";
    pub const WRONG_SERVICE_ACCOUNT: &str = "wrong_service_account";
    pub const NO_NODE: &str = "no_node";
    pub const WRONG_NODE: &str = "wrong_node";
    pub const REVIEW_FAILED: &str = "review_failed";
    /// Debug only: the SubjectAccessReview did not allow the call.
    pub const FORBIDDEN: &str = "forbidden";
}

/// A refusal: its gRPC code, a metric label and what the caller is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub reason: &'static str,
    pub detail: String,
}

impl Refusal {
    pub fn new(code: Code, reason: &'static str, detail: impl Into<String>) -> Self {
        Refusal { code, reason, detail: detail.into() }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        let message = r.to_string();
        match r.code {
            Code::Unauthenticated => tonic::Status::unauthenticated(message),
            Code::PermissionDenied => tonic::Status::permission_denied(message),
            Code::Unavailable => tonic::Status::unavailable(message),
        }
    }
}

/// The node a stream proved to speak for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proven {
    pub node: String,
    /// The token's `exp` (read once the review accepted it): the stream ends then.
    pub expires: Option<SystemTime>,
    /// The ServiceAccount user the review named.
    pub username: String,
}

/// The bearer token of `authorization: Bearer <token>`.
pub(crate) fn bearer(metadata: &MetadataMap) -> Result<&str, Refusal> {
    let no = |detail: &str| Refusal::new(Code::Unauthenticated, reason::NO_TOKEN, detail);
    let Some(value) = metadata.get("authorization") else {
        return Err(no("no authorization metadata: send `authorization: Bearer <token>`"));
    };
    let value = value.to_str().map_err(|_| no("the authorization metadata is not text"))?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(no("the authorization metadata is not `Bearer <token>`"));
    }
    if token.len() > MAX_TOKEN {
        return Err(Refusal::new(Code::Unauthenticated, reason::INVALID_TOKEN, "the bearer token is too long"));
    }
    Ok(token)
}

/// A JWT's claims, read without checking the signature: only after a review vouched for the
/// token (its expiry) or to name why it was refused (its audience).
pub(crate) fn claims(token: &str) -> Option<serde_json::Value> {
    let payload = token.split('.').nth(1)?;
    serde_json::from_slice(&base64url(payload)?).ok()
}

fn base64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().take_while(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

/// The `exp` claim of a JWT.
pub(crate) fn expiry(token: &str) -> Option<SystemTime> {
    let exp = claims(token)?.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

/// Bounded memory of reviews, keyed by a hash of the token (and what was asked).
pub(crate) struct Cache<V> {
    entries: Mutex<CacheInner<V>>,
    capacity: usize,
}

struct CacheInner<V> {
    map: HashMap<[u8; 32], (Instant, u64, V)>,
    next: u64,
}

impl<V: Clone> Cache<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Cache { entries: Mutex::new(CacheInner { map: HashMap::new(), next: 0 }), capacity: capacity.max(1) }
    }

    pub(crate) fn key(parts: &[&[u8]]) -> [u8; 32] {
        let mut h = Sha256::new();
        for p in parts {
            // Length-prefixed: ("ab","c") and ("a","bc") differ.
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        h.finalize().into()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner<V>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, key: &[u8; 32]) -> Option<V> {
        let mut inner = self.lock();
        match inner.map.get(key) {
            Some((until, _, v)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                inner.map.remove(key);
                None
            }
            None => None,
        }
    }

    pub(crate) fn put(&self, key: [u8; 32], value: V, keep: Duration) {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.map.len() >= self.capacity && !inner.map.contains_key(&key) {
            inner.map.retain(|_, (until, _, _)| *until > now);
            if inner.map.len() >= self.capacity {
                // Full of live entries: the oldest goes (a scan, only when full).
                if let Some(oldest) = inner.map.iter().min_by_key(|(_, (_, seq, _))| *seq).map(|(k, _)| *k) {
                    inner.map.remove(&oldest);
                }
            }
        }
        inner.next += 1;
        let seq = inner.next;
        inner.map.insert(key, (now + keep, seq, value));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().map.len()
    }
}

/// How long to keep an accepted review: [`ACCEPTED_FOR`], never past the token's expiry.
pub(crate) fn keep_until_expiry(expires: Option<SystemTime>) -> Duration {
    let left = expires.map(|e| e.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO));
    left.map_or(ACCEPTED_FOR, |l| l.min(ACCEPTED_FOR))
}

/// Proves which node an executor's stream speaks for.
pub struct Executors {
    reviewer: Arc<dyn Reviewer>,
    audience: String,
    /// `ns:name` of the executors' ServiceAccount.
    service_account: String,
    cache: Cache<Result<Proven, Refusal>>,
    reviews: Semaphore,
    /// TokenReviews sent (`kuport_token_reviews_total`).
    sent: Counter,
}

impl Executors {
    /// Executors whose tokens are for `audience` and belong to `service_account` ("ns:name").
    pub fn new(reviewer: Arc<dyn Reviewer>, audience: impl Into<String>, service_account: impl Into<String>) -> Self {
        Executors {
            reviewer,
            audience: audience.into(),
            service_account: service_account.into(),
            cache: Cache::new(CACHE_ENTRIES),
            reviews: Semaphore::new(CONCURRENT_REVIEWS),
            sent: Counter::default(),
        }
    }

    /// Counts the TokenReviews it sends on `counter` (the metrics').
    pub fn counting(mut self, counter: Counter) -> Self {
        self.sent = counter;
        self
    }

    /// TokenReviews sent so far.
    pub fn reviews_sent(&self) -> u64 {
        self.sent.get()
    }

    /// The ServiceAccount username tokens must name.
    fn username(&self) -> String {
        let (ns, name) = self.service_account.split_once(':').unwrap_or(("", &self.service_account));
        format!("system:serviceaccount:{ns}:{name}")
    }

    /// The node the bearer token in `metadata` proves, from the cache when it was reviewed
    /// lately.
    pub async fn prove(&self, metadata: &MetadataMap) -> Result<Proven, Refusal> {
        let token = bearer(metadata)?;
        let key = Cache::<()>::key(&[token.as_bytes()]);
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        let permit = self.reviews.acquire().await;
        // Another stream with this token may have finished its review while this one waited.
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        self.sent.inc();
        let audiences = [self.audience.clone()];
        let reviewed = self.reviewer.token_review(token, &audiences).await;
        drop(permit);
        let result = match reviewed {
            Ok(r) => self.judge(token, &r),
            // Not remembered: the API server may answer the next attempt.
            Err(e) => return Err(Refusal::new(Code::Unavailable, reason::REVIEW_FAILED, e.0)),
        };
        let keep = match &result {
            Ok(p) => keep_until_expiry(p.expires),
            Err(_) => REFUSED_FOR,
        };
        self.cache.put(key, result.clone(), keep);
        result
    }

    /// The review's verdict on `token`.
    fn judge(&self, token: &str, r: &Reviewed) -> Result<Proven, Refusal> {
        let refuse = |code, reason, detail: String| Err(Refusal::new(code, reason, detail));
        if !r.authenticated {
            // The unverified claims only choose the label; the API server's word is the reason.
            let aud = claims(token).and_then(|c| c.get("aud").cloned());
            let for_us = match &aud {
                Some(serde_json::Value::String(a)) => *a == self.audience,
                Some(serde_json::Value::Array(a)) => a.iter().any(|a| a.as_str() == Some(&self.audience)),
                _ => true,
            };
            let why = if r.error.is_empty() { "not authenticated" } else { r.error.as_str() };
            return if for_us {
                refuse(Code::Unauthenticated, reason::INVALID_TOKEN, format!("the token review refused it: {why}"))
            } else {
                refuse(
                    Code::Unauthenticated,
                    reason::WRONG_AUDIENCE,
                    format!("the token is not for audience {:?}: {why}", self.audience),
                )
            };
        }
        if !r.audiences.contains(&self.audience) {
            return refuse(
                Code::Unauthenticated,
                reason::WRONG_AUDIENCE,
                format!("the token is not for audience {:?} (the review names {:?})", self.audience, r.audiences),
            );
        }
        let want = self.username();
        if r.username != want {
            return refuse(
                Code::PermissionDenied,
                reason::WRONG_SERVICE_ACCOUNT,
                format!("the token is {:?}'s, not the executors' ({want})", r.username),
            );
        }
        let node = match r.extra.get(NODE_NAME_EXTRA).map(Vec::as_slice) {
            Some([node]) if !node.is_empty() => node.clone(),
            other => {
                return refuse(
                    Code::PermissionDenied,
                    reason::NO_NODE,
                    format!(
                        "the token names {} nodes in {NODE_NAME_EXTRA} (one expected: a token bound to the executor's Pod, Kubernetes 1.32 or later)",
                        other.map_or(0, <[String]>::len)
                    ),
                );
            }
        };
        Ok(Proven { node, expires: expiry(token), username: r.username.clone() })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A Reviewer answering from a table of tokens; counts the reviews asked.
    #[derive(Default)]
    pub(crate) struct FakeReviewer {
        pub tokens: Mutex<HashMap<String, Reviewed>>,
        pub allowed: Mutex<Vec<(String, Access)>>,
        pub token_reviews: AtomicUsize,
        pub access_reviews: AtomicUsize,
        pub fail: std::sync::atomic::AtomicBool,
    }

    impl FakeReviewer {
        pub(crate) fn add(&self, token: &str, r: Reviewed) {
            self.tokens.lock().unwrap().insert(token.into(), r);
        }
        pub(crate) fn allow(&self, user: &str, access: Access) {
            self.allowed.lock().unwrap().push((user.into(), access));
        }
    }

    impl Reviewer for FakeReviewer {
        fn token_review<'a>(
            &'a self,
            token: &'a str,
            audiences: &'a [String],
        ) -> BoxFuture<'a, Result<Reviewed, ReviewError>> {
            Box::pin(async move {
                self.token_reviews.fetch_add(1, Ordering::SeqCst);
                if self.fail.load(Ordering::SeqCst) {
                    return Err(ReviewError("the API server is away".into()));
                }
                let Some(r) = self.tokens.lock().unwrap().get(token).cloned() else {
                    return Ok(Reviewed { error: "invalid bearer token".into(), ..Default::default() });
                };
                // As the API server: a token for another audience is not authenticated.
                if !audiences.is_empty() && !audiences.iter().any(|a| r.audiences.contains(a)) {
                    return Ok(Reviewed {
                        error: "token audiences is invalid for the target audiences".into(),
                        ..Default::default()
                    });
                }
                Ok(r)
            })
        }

        fn access_review<'a>(
            &'a self,
            user: &'a Reviewed,
            access: &'a Access,
        ) -> BoxFuture<'a, Result<Decision, ReviewError>> {
            Box::pin(async move {
                self.access_reviews.fetch_add(1, Ordering::SeqCst);
                let allowed = self.allowed.lock().unwrap().iter().any(|(u, a)| *u == user.username && a == access);
                Ok(Decision { allowed, reason: if allowed { "RBAC: allowed".into() } else { String::new() } })
            })
        }
    }

    pub(crate) fn b64(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }

    /// A JWT-shaped token (unsigned: the fake reviewer vouches for it).
    pub(crate) fn jwt(aud: &str, exp: u64, id: &str) -> String {
        let claims = serde_json::json!({ "aud": [aud], "exp": exp, "jti": id });
        format!("{}.{}.sig", b64(br#"{"alg":"RS256"}"#), b64(claims.to_string().as_bytes()))
    }

    pub(crate) fn now_secs() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }

    pub(crate) fn executor(node: &str) -> Reviewed {
        Reviewed {
            authenticated: true,
            audiences: vec![crate::trust::EXECUTOR_AUDIENCE.into()],
            username: "system:serviceaccount:kuport-system:kuport-node-exec".into(),
            uid: "sa-uid".into(),
            groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
            extra: [(NODE_NAME_EXTRA.to_string(), vec![node.to_string()])].into(),
            error: String::new(),
        }
    }

    pub(crate) fn metadata(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    fn executors(fake: &Arc<FakeReviewer>) -> Executors {
        Executors::new(fake.clone(), crate::trust::EXECUTOR_AUDIENCE, "kuport-system:kuport-node-exec")
    }

    #[tokio::test]
    async fn a_pod_bound_token_proves_its_node_once_per_minute() {
        let fake = Arc::new(FakeReviewer::default());
        let exp = now_secs() + 3600;
        let token = jwt(crate::trust::EXECUTOR_AUDIENCE, exp, "1");
        fake.add(&token, executor("worker-1"));
        let ex = executors(&fake);
        for _ in 0..5 {
            let p = ex.prove(&metadata(&token)).await.unwrap();
            assert_eq!(p.node, "worker-1");
            assert_eq!(p.expires, Some(UNIX_EPOCH + Duration::from_secs(exp)));
        }
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1, "the cache answers the rest");
        assert_eq!(ex.reviews_sent(), 1);
    }

    #[tokio::test]
    async fn every_refusal_has_its_reason() {
        let fake = Arc::new(FakeReviewer::default());
        let exp = now_secs() + 3600;
        let aud = crate::trust::EXECUTOR_AUDIENCE;
        let other_sa = jwt(aud, exp, "sa");
        fake.add(
            &other_sa,
            Reviewed { username: "system:serviceaccount:default:default".into(), ..executor("worker-1") },
        );
        let other_aud = jwt("https://kubernetes.default.svc", exp, "aud");
        fake.add(
            &other_aud,
            Reviewed { audiences: vec!["https://kubernetes.default.svc".into()], ..executor("worker-1") },
        );
        let unbound = jwt(aud, exp, "unbound");
        fake.add(&unbound, Reviewed { extra: BTreeMap::new(), ..executor("worker-1") });
        let two = jwt(aud, exp, "two");
        fake.add(
            &two,
            Reviewed { extra: [(NODE_NAME_EXTRA.into(), vec!["a".into(), "b".into()])].into(), ..executor("a") },
        );
        let unknown = jwt(aud, exp, "unknown");
        let ex = executors(&fake);
        let cases: Vec<(MetadataMap, Code, &str)> = vec![
            (MetadataMap::new(), Code::Unauthenticated, reason::NO_TOKEN),
            (
                {
                    let mut m = MetadataMap::new();
                    m.insert("authorization", "Basic dTpw".parse().unwrap());
                    m
                },
                Code::Unauthenticated,
                reason::NO_TOKEN,
            ),
            (metadata(&unknown), Code::Unauthenticated, reason::INVALID_TOKEN),
            (metadata("not-a-jwt"), Code::Unauthenticated, reason::INVALID_TOKEN),
            (metadata(&other_aud), Code::Unauthenticated, reason::WRONG_AUDIENCE),
            (metadata(&other_sa), Code::PermissionDenied, reason::WRONG_SERVICE_ACCOUNT),
            (metadata(&unbound), Code::PermissionDenied, reason::NO_NODE),
            (metadata(&two), Code::PermissionDenied, reason::NO_NODE),
        ];
        for (m, code, why) in cases {
            let r = ex.prove(&m).await.unwrap_err();
            assert_eq!((r.code, r.reason), (code, why), "{r}");
            let status = tonic::Status::from(r.clone());
            assert!(status.message().starts_with(why), "{status:?}");
        }
        // Authenticated, but the review names another audience (an API server ignoring spec.audiences).
        let lax = ex.judge(&jwt(aud, exp, "lax"), &Reviewed { audiences: vec!["other".into()], ..executor("w") });
        assert_eq!(lax.unwrap_err().reason, reason::WRONG_AUDIENCE);
        // Refusals are remembered too: a retry loop sends no new review.
        let before = fake.token_reviews.load(Ordering::SeqCst);
        assert_eq!(ex.prove(&metadata(&other_sa)).await.unwrap_err().reason, reason::WRONG_SERVICE_ACCOUNT);
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), before);
        // A failed review is not remembered and is no one's fault.
        fake.fail.store(true, Ordering::SeqCst);
        let fresh = jwt(aud, exp, "fresh");
        for _ in 0..2 {
            let r = ex.prove(&metadata(&fresh)).await.unwrap_err();
            assert_eq!((r.code, r.reason), (Code::Unavailable, reason::REVIEW_FAILED));
        }
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), before + 2);
    }

    #[tokio::test]
    async fn an_accepted_review_is_kept_no_longer_than_the_token() {
        let fake = Arc::new(FakeReviewer::default());
        let token = jwt(crate::trust::EXECUTOR_AUDIENCE, now_secs() + 1, "short");
        fake.add(&token, executor("worker-1"));
        let ex = executors(&fake);
        ex.prove(&metadata(&token)).await.unwrap();
        ex.prove(&metadata(&token)).await.unwrap();
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        // The API server would now refuse it; here the fake still vouches, but it is asked again.
        ex.prove(&metadata(&token)).await.unwrap();
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_cache_is_bounded_and_drops_the_oldest() {
        let cache = Cache::<u32>::new(3);
        let k = |i: u32| Cache::<u32>::key(&[&i.to_be_bytes()]);
        for i in 0..5 {
            cache.put(k(i), i, Duration::from_secs(60));
        }
        assert_eq!(cache.len(), 3);
        assert_eq!((cache.get(&k(0)), cache.get(&k(1)), cache.get(&k(4))), (None, None, Some(4)));
        assert_ne!(Cache::<u32>::key(&[b"ab", b"c"]), Cache::<u32>::key(&[b"a", b"bc"]));
    }

    #[test]
    fn jwt_claims_decode() {
        let t = jwt("x", 42, "id");
        assert_eq!(expiry(&t), Some(UNIX_EPOCH + Duration::from_secs(42)));
        assert_eq!(expiry("a.b"), None);
        assert_eq!(expiry("nodots"), None);
        assert_eq!(base64url("aGk").as_deref(), Some(&b"hi"[..]));
    }
}
