//! Events: what an operator should see in `kubectl describe` when a PortMap's status changes
//! (a new refusal, a change of serving node), or when a class status row newly says that an
//! executor's report was refused; decided from the old and new status alone.

use kube::runtime::events::{Event, EventType};

use crate::api::{PortMapClassStatus, PortMapStatus};
use crate::compute::portmap::status::reason;
use crate::observe::facts::reason as facts_reason;

/// The events a class status going from `old` to `new` warrants: one per refusal of an
/// executor's report that a node row says now and did not say before.
pub fn of_class_change(old: Option<&PortMapClassStatus>, new: &PortMapClassStatus) -> Vec<Event> {
    let codes =
        [facts_reason::INVALID_FACTS, facts_reason::UNDERLAY_NOT_NODE_ADDRESS, facts_reason::UNDERLAY_ADDRESS_CLASH];
    let said = |s: Option<&PortMapClassStatus>, node: &str| -> Vec<String> {
        s.into_iter()
            .flat_map(|s| &s.nodes)
            .filter(|r| r.name == node)
            .flat_map(|r| r.message.split("; ").map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    let mut events = Vec::new();
    for row in &new.nodes {
        let before = said(old, &row.name);
        for part in row.message.split("; ") {
            let Some(code) = codes.iter().find(|c| part.starts_with(&format!("{c}: "))) else { continue };
            if before.iter().any(|b| b == part) {
                continue;
            }
            events.push(Event {
                type_: EventType::Warning,
                reason: (*code).to_string(),
                note: Some(format!("node {}: {}", row.name, &part[code.len() + 2..])),
                action: "RefuseFacts".into(),
                secondary: Some(k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(row.name.clone()),
                    ..Default::default()
                }),
            });
        }
    }
    events
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClassNodeStatus;

    fn status(message: &str) -> PortMapClassStatus {
        PortMapClassStatus {
            nodes: vec![ClassNodeStatus { name: "edge-a".into(), message: message.into(), ..Default::default() }],
            ..Default::default()
        }
    }

    #[test]
    fn a_refused_report_gets_one_event_naming_node_and_field() {
        let refused = "Node is not Ready; UnderlayNotNodeAddress: underlayAddress: 100.64.0.66 is not one of Node edge-a's status.addresses (100.64.93.143)";
        let events = of_class_change(Some(&status("Node is not Ready")), &status(refused));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, facts_reason::UNDERLAY_NOT_NODE_ADDRESS);
        let note = events[0].note.clone().unwrap_or_default();
        assert!(note.starts_with("node edge-a: underlayAddress: 100.64.0.66"), "{note}");
        assert!(of_class_change(Some(&status(refused)), &status(refused)).is_empty(), "said once");
        assert!(of_class_change(None, &status("Node is not Ready")).is_empty());
    }
}
