//! Waiting on the rtnl watch in root tests.

use std::time::Duration;

use kuport_node_exec::rtnl::{Subject, Subscription};

/// Waits up to a second for a removal notification about `subject`.
pub fn notified(rt: &tokio::runtime::Runtime, sub: &mut Subscription, subject: Subject) -> bool {
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(n) = sub.recv().await {
                if n.subject == subject && n.removed {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false)
    })
}
