//! Debug is authorized by Kubernetes RBAC: the caller's bearer token passes a TokenReview (the
//! API server's own audiences) and a SubjectAccessReview for a kuport verb on a named resource,
//! for example `get` on `nodestates.kuport.wlz.li` named after the node. Every replica checks,
//! followers included. docs/security.md.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;
use tonic::metadata::MetadataMap;

use super::identity::{
    ACCEPTED_FOR, Access, CACHE_ENTRIES, CONCURRENT_REVIEWS, Cache, Code, REFUSED_FOR, Refusal, Reviewed, Reviewer,
    bearer, expiry, keep_until_expiry, reason,
};

/// Debug's resources in group kuport.wlz.li (the chart's `kuport-debug` ClusterRole grants them).
pub mod resource {
    /// A node's state: `get` names the node, `list` lists them all.
    pub const NODE_STATES: &str = "nodestates";
    pub const PORT_MAPS: &str = "portmaps";
}

/// Checks Debug calls against RBAC.
pub struct DebugAccess {
    reviewer: Arc<dyn Reviewer>,
    /// Reviewed users by token hash.
    users: Cache<Result<Reviewed, Refusal>>,
    /// Decisions by token hash and access.
    decisions: Cache<Result<(), Refusal>>,
    reviews: Semaphore,
    /// TokenReviews and SubjectAccessReviews sent.
    sent: Counter,
}

impl DebugAccess {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        DebugAccess {
            reviewer,
            users: Cache::new(CACHE_ENTRIES),
            decisions: Cache::new(CACHE_ENTRIES),
            reviews: Semaphore::new(CONCURRENT_REVIEWS),
            sent: Counter::default(),
        }
    }

    /// Counts the reviews it sends on `counter` (the metrics').
    pub fn counting(mut self, counter: Counter) -> Self {
        self.sent = counter;
        self
    }

    /// Reviews sent so far (TokenReviews and SubjectAccessReviews).
    pub fn reviews_sent(&self) -> u64 {
        self.sent.get()
    }

    /// Ok when the caller of `metadata` may `verb` the `resource` (group kuport.wlz.li) in
    /// `namespace` named `name`.
    pub async fn check(
        &self,
        metadata: &MetadataMap,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), tonic::Status> {
        self.decide(metadata, verb, resource, namespace, name).await.map_err(Into::into)
    }

    /// [`Self::check`] with the refusal's reason (a metric label).
    pub async fn decide(
        &self,
        metadata: &MetadataMap,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), Refusal> {
        let token = bearer(metadata)?;
        let access = Access {
            verb: verb.into(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
            name: name.map(Into::into),
        };
        let key = Cache::<()>::key(&[
            token.as_bytes(),
            verb.as_bytes(),
            resource.as_bytes(),
            namespace.unwrap_or("\0").as_bytes(),
            name.unwrap_or("\0").as_bytes(),
        ]);
        if let Some(hit) = self.decisions.get(&key) {
            return hit;
        }
        let user = self.user(token).await?;
        let decided = {
            let _permit = self.reviews.acquire().await;
            self.sent.inc();
            self.reviewer.access_review(&user, &access).await
        };
        let result = match decided {
            Ok(d) if d.allowed => Ok(()),
            Ok(d) => {
                let scope = match (namespace, name) {
                    (Some(ns), Some(n)) => format!(" {n:?} in namespace {ns:?}"),
                    (Some(ns), None) => format!(" in namespace {ns:?}"),
                    (None, Some(n)) => format!(" {n:?}"),
                    (None, None) => String::new(),
                };
                let why = if d.reason.is_empty() { String::new() } else { format!(": {}", d.reason) };
                Err(Refusal::new(
                    Code::PermissionDenied,
                    reason::FORBIDDEN,
                    format!(
                        "{:?} may not {verb} {resource}.{}{scope} (grant it with the chart's kuport-debug ClusterRole){why}",
                        user.username,
                        super::identity::API_GROUP
                    ),
                ))
            }
            Err(e) => return Err(Refusal::new(Code::Unavailable, reason::REVIEW_FAILED, e.0)),
        };
        let keep = if result.is_ok() { keep_until_expiry(expiry(token)).min(ACCEPTED_FOR) } else { REFUSED_FOR };
        self.decisions.put(key, result.clone(), keep);
        result
    }

    /// Who `token` is, reviewed for the API server's own audiences.
    async fn user(&self, token: &str) -> Result<Reviewed, Refusal> {
        let key = Cache::<()>::key(&[token.as_bytes()]);
        if let Some(hit) = self.users.get(&key) {
            return hit;
        }
        let reviewed = {
            let _permit = self.reviews.acquire().await;
            self.sent.inc();
            self.reviewer.token_review(token, &[]).await
        };
        let result = match reviewed {
            Ok(r) if r.authenticated => Ok(r),
            Ok(r) => Err(Refusal::new(
                Code::Unauthenticated,
                reason::INVALID_TOKEN,
                format!(
                    "the token review refused it: {}",
                    if r.error.is_empty() { "not authenticated" } else { r.error.as_str() }
                ),
            )),
            Err(e) => return Err(Refusal::new(Code::Unavailable, reason::REVIEW_FAILED, e.0)),
        };
        let keep = if result.is_ok() { keep_until_expiry(expiry(token)) } else { REFUSED_FOR };
        self.users.put(key, result.clone(), keep);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::identity::tests::{FakeReviewer, jwt, metadata, now_secs};
    use std::sync::atomic::Ordering;

    fn user(name: &str) -> Reviewed {
        Reviewed {
            authenticated: true,
            audiences: vec!["https://kubernetes.default.svc.cluster.local".into()],
            username: name.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_call_needs_the_rbac_permission_for_its_resource() {
        let fake = Arc::new(FakeReviewer::default());
        let token = jwt("https://kubernetes.default.svc.cluster.local", now_secs() + 600, "u");
        fake.add(&token, user("alice"));
        let get = |node: &str| Access {
            verb: "get".into(),
            resource: resource::NODE_STATES.into(),
            namespace: None,
            name: Some(node.into()),
        };
        fake.allow("alice", get("worker-1"));
        let access = DebugAccess::new(fake.clone());
        let m = metadata(&token);
        for _ in 0..3 {
            access.check(&m, "get", resource::NODE_STATES, None, Some("worker-1")).await.unwrap();
        }
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
        assert_eq!(fake.access_reviews.load(Ordering::SeqCst), 1, "decisions are cached");
        let no = access.decide(&m, "get", resource::NODE_STATES, None, Some("worker-2")).await.unwrap_err();
        assert_eq!((no.code, no.reason), (Code::PermissionDenied, reason::FORBIDDEN));
        assert!(no.detail.contains("\"alice\" may not get nodestates.kuport.wlz.li \"worker-2\""), "{}", no.detail);
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1, "the user is cached");
        let list = access.check(&m, "list", resource::NODE_STATES, None, None).await.unwrap_err();
        assert_eq!(list.code(), tonic::Code::PermissionDenied);
        assert_eq!(access.reviews_sent(), 4, "one TokenReview, three SubjectAccessReviews");
        let none = access.check(&MetadataMap::new(), "list", resource::NODE_STATES, None, None).await.unwrap_err();
        assert_eq!(none.code(), tonic::Code::Unauthenticated);
        let bad = access.decide(&metadata("forged"), "list", resource::NODE_STATES, None, None).await.unwrap_err();
        assert_eq!((bad.code, bad.reason), (Code::Unauthenticated, reason::INVALID_TOKEN));
    }
}
