//! Events: what an operator should see in `kubectl describe` when a PortMap's status changes
//! (a new refusal, a change of serving node), decided from the old and new status alone.

use kube::runtime::events::{Event, EventType};

use crate::api::PortMapStatus;
use crate::compute::portmap::status::reason;

/// The events a PortMap's status going from `old` to `new` warrants.
pub fn of_change(old: Option<&PortMapStatus>, new: &PortMapStatus) -> Vec<Event> {
    let refusal = |s: Option<&PortMapStatus>| {
        s.and_then(|s| s.conditions.iter().find(|c| c.status == "False" && c.reason != reason::NOT_ACCEPTED))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let mut events = Vec::new();
    if let Some((r, m)) = refusal(Some(new))
        && refusal(old).map(|o| o.0) != Some(r.clone())
        && r != reason::PENDING
    {
        events.push(Event {
            type_: EventType::Warning,
            reason: r,
            note: Some(m),
            action: "Refuse".into(),
            secondary: None,
        });
    }
    let node = |s: Option<&PortMapStatus>| s.and_then(|s| s.endpoint.as_ref()).map(|e| e.node.clone());
    if let (Some(before), Some(after)) = (node(old), node(Some(new)))
        && before != after
    {
        events.push(Event {
            type_: EventType::Normal,
            reason: "ServingNodeChanged".into(),
            note: Some(format!("the pod is now reached on node {after} (was {before})")),
            action: "Reprogram".into(),
            // The new node as the related object: the recorder folds events by regarding,
            // reason and related (not by note), so without it a later move would only
            // bump the count of the first event, which keeps its old message.
            secondary: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(after.clone()),
                ..Default::default()
            }),
        });
    }
    events
}
