//! Freeing large replaced states on a thread of their own.

use std::sync::Arc;

use kuport_proto::v1::NetnsState;

/// States holding at least this many nft elements are freed by [`drop_elsewhere`]'s thread.
const DROP_ELSEWHERE: usize = 10_000;

/// Frees `state` on a thread of its own when this is its last reference and it is large:
/// freeing a 50,000-mapping state (about a million allocations) took 13 to 71 ms on the
/// benchmark machine (docs/performance.md), which the apply that replaces it need not wait for.
pub(crate) fn drop_elsewhere(state: Arc<NetnsState>) {
    static DROPPER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Arc<NetnsState>>>> = std::sync::OnceLock::new();
    let elements: usize = state.nft_tables.iter().flat_map(|t| &t.sets).map(|s| s.elements.len()).sum();
    if elements < DROP_ELSEWHERE || Arc::strong_count(&state) > 1 {
        return;
    }
    let dropper = DROPPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Arc<NetnsState>>();
        let thread = std::thread::Builder::new().name("kuport-dropper".into());
        let free = |state: Arc<NetnsState>| {
            let t = std::time::Instant::now();
            drop(state);
            let freed = t.elapsed();
            tracing::debug!(?freed, "dropper");
        };
        thread.spawn(move || rx.into_iter().for_each(free)).ok().map(|_| tx)
    });
    if let Some(tx) = dropper {
        // Fails only when the thread is gone; the state is then freed here.
        let _ = tx.send(state);
    }
}
