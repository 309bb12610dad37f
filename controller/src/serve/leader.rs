//! Who leads. Only the leader serves NodeSync; its term fences the states it sends, so an
//! executor never goes back to an old leader's state.

use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub leader: bool,
    /// Grows with every new leader; the standalone controller uses its start time in ms.
    pub term: u64,
    /// host:port of the leader's NodeSync, empty when unknown.
    pub leader_address: String,
}

/// A controller that always leads (standalone: one replica reading a manifest folder).
pub fn standalone(advertise: String) -> (watch::Sender<Leadership>, watch::Receiver<Leadership>) {
    let term = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    watch::channel(Leadership { leader: true, term, leader_address: advertise })
}
