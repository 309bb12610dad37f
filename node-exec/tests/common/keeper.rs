//! An executor's keep loop on its own thread, for root tests: stopped (never tearing down) on
//! drop.

use kuport_node_exec::executor::{Executor, StatsHandle};
use kuport_proto::v1::NetnsState;

pub struct Keeper {
    pub stats: StatsHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Keeps `state` with `ex` until dropped.
    pub fn start(mut ex: Executor, state: NetnsState) -> Self {
        let stats = ex.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                ex.keep(&state, async move {
                    let _ = stopped.await;
                })
                .await
                .expect("keep");
            });
        });
        Keeper { stats, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
