//! Stream: from the computation to the executors. The [`hub`] recomputes on change (paced),
//! publishes each node's state and counts acknowledgements; [`sync`] serves NodeSync, one stream
//! per executor, sending only the namespaces it does not hold ([`held`]); [`leader`] elects the
//! one replica that streams and writes; [`peers`] checks the executors' peer reports.

pub mod held;
pub mod hub;
pub mod leader;
pub mod peers;
pub mod sync;

pub use hub::Hub;
