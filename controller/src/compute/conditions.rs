//! Conditions, as every capability writes them: a condition keeps its transition time while its
//! status stays the same, so recomputing an unchanged object writes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition that keeps the previous transition time when its status did not change, so
/// recomputing an unchanged object writes nothing.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// `c` as computed, with the stored transition time when `previous` holds the same status: what
/// a status writer does to every condition it does not decide itself.
pub fn keep_time(previous: &[Condition], c: &Condition, generation: Option<i64>, now: Timestamp) -> Condition {
    condition(previous, &c.type_, c.status == "True", &c.reason, c.message.clone(), generation, now)
}
