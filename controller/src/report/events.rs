//! Events: what an operator should see in `kubectl describe` when a PortMap's status changes
//! (a new refusal, a change of serving node), or when a class status row newly says that an
//! executor's report was refused, or when an Intercept's status changes (Accepted turning
//! False, a pod refused, Programmed turning True), or when a Node is refused from the overlay,
//! or when a member's route to a peer changes (relayed, direct, unreachable); decided from the
//! old and new status (or refusals, or routes) alone.

use std::collections::{BTreeMap, BTreeSet};

use kube::runtime::events::{Event, EventType};

use crate::api::{InterceptStatus, PortMapClassStatus, PortMapStatus};
use crate::compute::intercept::pods::{self as intercept, reason as intercept_reason};
use crate::compute::overlay::members::REPORT_REFUSED;
use crate::compute::overlay::relays::PeerRoute;
use crate::compute::overlay::{self, Places, Refusal, reason as overlay_reason};
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

/// One refusal from the mesh as events remember it: the field and the reason.
pub type Said = (String, &'static str);

/// The Warning events a node refused from the mesh warrants: one per refusal (field, reason)
/// not in `before`, what was said for it last. A key merely awaited (NoPublicKey while the
/// executor connects) is no event: every node would get one at each start.
pub fn of_overlay_refusal(before: &BTreeSet<Said>, refused: &[Refusal]) -> Vec<Event> {
    refused
        .iter()
        .filter(|r| r.reason != overlay_reason::NO_PUBLIC_KEY || r.message.starts_with(REPORT_REFUSED))
        .filter(|r| !before.contains(&(r.field.clone(), r.reason)))
        .map(|r| Event {
            type_: EventType::Warning,
            reason: r.reason.to_string(),
            note: Some(format!("not in the overlay: {}: {}", r.field, r.message)),
            action: "RefuseOverlay".into(),
            secondary: None,
        })
        .collect()
}

/// What [`of_overlay_refusal`] remembers of `refused`.
pub fn said(refused: &[Refusal]) -> BTreeSet<Said> {
    refused.iter().map(|r| (r.field.clone(), r.reason)).collect()
}

/// The reasons of the events on a member's Node when its route to a peer changes
/// (docs/overlay/status.md, "Events").
pub mod route_reason {
    /// The pair goes through a relay now (or through another relay than before).
    pub const RELAYED: &str = "OverlayRelayed";
    /// The pair goes directly again.
    pub const DIRECT: &str = "OverlayDirect";
    /// A side reports the other unreachable and no relay both reach: its pod traffic is lost.
    pub const UNREACHABLE: &str = "OverlayUnreachable";
}

/// The events member `node`'s routes warrant when they go from `before` (peer to route, as its
/// stored `kuport.wlz.li/wireguard-routes` annotation says; None: it has none, as for a new
/// member) to what `nodes` computed: one per peer whose route changed, naming the peer, the new
/// route and who reports whom unreachable. A peer missing from `before` counts as direct, so a
/// new member's direct pairs are no event. On a member's Node only, the peer's Node as the
/// related object: the recorder folds events by regarding, reason and related.
pub fn of_route_change(node: &str, before: Option<&BTreeMap<String, String>>, nodes: &Places) -> Vec<Event> {
    use kuport_proto::v1::Reach;
    let Some(me) = nodes.get(node).filter(|o| o.public_key.is_some()) else { return Vec::new() };
    let direct = PeerRoute::Direct.to_string();
    let mut events = Vec::new();
    for (peer, route) in &me.routes {
        let was = before.and_then(|b| b.get(peer)).unwrap_or(&direct);
        let now = route.to_string();
        if *was == now {
            continue;
        }
        let reports = |a: &str, b: &str| {
            let seen = overlay::seen_of(nodes, a, b);
            seen.is_some_and(|s| s.reach == Reach::Unreachable).then(|| format!("{a} reports {b} unreachable"))
        };
        let why: Vec<String> = [reports(node, peer), reports(peer, node)].into_iter().flatten().collect();
        let why = if why.is_empty() { "no side reports the other unreachable".to_string() } else { why.join(" and ") };
        let (type_, reason, note) = match route {
            PeerRoute::Via(_) if *was == direct => {
                (EventType::Normal, route_reason::RELAYED, format!("{peer} {now}: {why}"))
            }
            PeerRoute::Via(_) => (EventType::Normal, route_reason::RELAYED, format!("{peer} {now} (was {was}): {why}")),
            PeerRoute::Direct => (
                EventType::Normal,
                route_reason::DIRECT,
                format!("{peer} direct (was {was}): neither side reports the other unreachable"),
            ),
            PeerRoute::Unreachable => (
                EventType::Warning,
                route_reason::UNREACHABLE,
                format!("{peer} unreachable (was {was}): {why}, and no relay both reach directly"),
            ),
        };
        events.push(Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Route".into(),
            secondary: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(peer.clone()),
                ..Default::default()
            }),
        });
    }
    events
}

/// A stored `kuport.wlz.li/wireguard-routes` annotation read back: None when absent or not a
/// JSON object of strings (then every route counts as direct before).
pub fn stored_routes(annotations: Option<&BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    let text = annotations?.get(crate::compute::overlay::ROUTES_ANNOTATION)?;
    serde_json::from_str(text).ok()
}

/// At most this many pod events per Intercept status write: the status lists every pod.
pub const MAX_POD_EVENTS: usize = 10;

/// The events an Intercept's status (in `namespace`) going from `old` to `new` warrants, each
/// only on change: Accepted turning False (Warning, its reason), a pod newly refused or refused
/// for a new reason (Warning, the pod's reason; not while the Intercept is not accepted, nor
/// Pending), Programmed turning True (Normal).
pub fn of_intercept_change(namespace: &str, old: Option<&InterceptStatus>, new: &InterceptStatus) -> Vec<Event> {
    let cond = |s: Option<&InterceptStatus>, t: &str| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == t)).map(|c| (c.status.clone(), c.reason.clone()))
    };
    let mut events = Vec::new();
    let accepted = new.conditions.iter().find(|c| c.type_ == intercept::ACCEPTED);
    let refused = accepted.is_some_and(|c| c.status == "False");
    if let Some(c) = accepted.filter(|_| refused)
        && cond(old, intercept::ACCEPTED) != Some(("False".into(), c.reason.clone()))
    {
        events.push(Event {
            type_: EventType::Warning,
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: "Refuse".into(),
            secondary: None,
        });
    }
    let before = |name: &str, why: &str| old.is_some_and(|o| o.pods.iter().any(|p| p.name == name && p.reason == why));
    let pods = new
        .pods
        .iter()
        .filter(|p| p.reason != intercept_reason::PENDING && !(refused && p.reason == intercept_reason::NOT_ACCEPTED))
        .filter(|p| !before(&p.name, &p.reason))
        .take(MAX_POD_EVENTS);
    for p in pods {
        let on = if p.node.is_empty() { String::new() } else { format!(" on node {}", p.node) };
        events.push(Event {
            type_: EventType::Warning,
            reason: p.reason.clone(),
            note: Some(format!("pod {}{on}: {}", p.name, p.message)),
            action: "RefusePod".into(),
            // The pod as the related object, so that two pods' events are not folded into one.
            secondary: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(namespace.into()),
                name: Some(p.name.clone()),
                ..Default::default()
            }),
        });
    }
    let programmed = |s: Option<&InterceptStatus>| cond(s, intercept::PROGRAMMED).is_some_and(|c| c.0 == "True");
    if programmed(Some(new)) && !programmed(old) {
        let message = new.conditions.iter().find(|c| c.type_ == intercept::PROGRAMMED).map(|c| c.message.clone());
        events.push(Event {
            type_: EventType::Normal,
            reason: intercept_reason::PROGRAMMED.into(),
            note: message,
            action: "Program".into(),
            secondary: None,
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

    fn intercept(accepted: (&str, &str), programmed: &str, pods: &[(&str, &str)]) -> InterceptStatus {
        let now: k8s_openapi::jiff::Timestamp = "2026-12-01T12:00:00Z".parse().expect("time");
        let c = |t: &str, status: &str, reason: &str| {
            crate::compute::conditions::condition(
                &[],
                t,
                status == "True",
                reason,
                format!("{t} {reason}"),
                Some(1),
                now,
            )
        };
        InterceptStatus {
            pods: pods
                .iter()
                .map(|(name, reason)| crate::api::PodProgress {
                    name: (*name).into(),
                    node: "worker-1".into(),
                    reason: (*reason).into(),
                    message: "why".into(),
                })
                .collect(),
            conditions: vec![
                c(intercept::ACCEPTED, accepted.0, accepted.1),
                c(intercept::PROGRAMMED, programmed, if programmed == "True" { "Programmed" } else { "Pending" }),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn an_overlay_refusal_gets_one_warning_per_new_reason() {
        use crate::compute::overlay::members::{FIELD_KEY, FIELD_POD_CIDRS};
        let r = |field: &str, reason: &'static str, message: &str| Refusal {
            node: "c".into(),
            field: field.into(),
            reason,
            message: message.into(),
        };
        let no_cidrs = r(FIELD_POD_CIDRS, overlay_reason::NO_POD_CIDRS, "the Node has no pod CIDRs");
        let awaited = r(FIELD_KEY, overlay_reason::NO_PUBLIC_KEY, "not reported yet");
        let events = of_overlay_refusal(&BTreeSet::new(), &[awaited.clone(), no_cidrs.clone()]);
        assert_eq!(events.len(), 1, "an awaited key is no event");
        assert_eq!((events[0].type_, events[0].reason.as_str()), (EventType::Warning, overlay_reason::NO_POD_CIDRS));
        assert_eq!(events[0].note.as_deref(), Some("not in the overlay: spec.podCIDRs: the Node has no pod CIDRs"));
        let before = said(std::slice::from_ref(&no_cidrs));
        assert!(of_overlay_refusal(&before, std::slice::from_ref(&no_cidrs)).is_empty(), "said once");
        let bad_report = r(FIELD_KEY, overlay_reason::NO_PUBLIC_KEY, &format!("{REPORT_REFUSED}: malformed"));
        let events = of_overlay_refusal(&before, &[bad_report, no_cidrs]);
        assert_eq!(events.len(), 1, "a refused report is");
        assert_eq!(events[0].reason, overlay_reason::NO_PUBLIC_KEY);
    }

    #[test]
    fn a_route_change_gets_one_event_per_peer_on_the_member_and_none_when_unchanged() {
        use crate::observe::ObservedPeer;
        use kuport_proto::v1::Reach;
        // Each member's key is its name, so its report names its peers by theirs.
        let member = |me: &str, routes: &[(&str, PeerRoute)], seen: &[(&str, Reach)]| {
            let report = seen.iter().map(|(p, r)| (p.to_string(), ObservedPeer { reach: *r, ..Default::default() }));
            let place = crate::compute::overlay::NodeOverlay {
                public_key: Some(me.into()),
                routes: routes.iter().map(|(p, r)| (p.to_string(), r.clone())).collect(),
                report: Some(std::sync::Arc::new(report.collect())),
                ..Default::default()
            };
            (me.to_string(), std::sync::Arc::new(place))
        };
        let via = PeerRoute::Via("cloud".into());
        let relayed = BTreeMap::from([
            member(
                "home-a",
                &[("cloud", PeerRoute::Direct), ("home-b", via.clone())],
                &[("home-b", Reach::Unreachable)],
            ),
            member("home-b", &[("cloud", PeerRoute::Direct), ("home-a", via.clone())], &[("home-a", Reach::Unknown)]),
        ]);
        let stored = |text: &str| {
            stored_routes(Some(&BTreeMap::from([(
                crate::compute::overlay::ROUTES_ANNOTATION.to_string(),
                text.to_string(),
            )])))
        };
        let was_direct = stored(r#"{"cloud":"direct","home-b":"direct"}"#);
        let events = of_route_change("home-a", was_direct.as_ref(), &relayed);
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].type_, events[0].reason.as_str()), (EventType::Normal, route_reason::RELAYED));
        assert_eq!(events[0].note.as_deref(), Some("home-b via cloud: home-a reports home-b unreachable"));
        assert_eq!(events[0].secondary.as_ref().and_then(|o| o.name.as_deref()), Some("home-b"));
        // The other member's Node gets its own, naming its peer: the reporter is still home-a.
        let events = of_route_change("home-b", None, &relayed);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].note.as_deref(), Some("home-a via cloud: home-a reports home-b unreachable"));
        // Unchanged (as a recompute finds it again): nothing.
        let was_relayed = stored(r#"{"cloud":"direct","home-b":"via cloud"}"#);
        assert!(of_route_change("home-a", was_relayed.as_ref(), &relayed).is_empty());
        // Direct again.
        let direct = BTreeMap::from([
            member("home-a", &[("cloud", PeerRoute::Direct), ("home-b", PeerRoute::Direct)], &[]),
            member("home-b", &[("cloud", PeerRoute::Direct), ("home-a", PeerRoute::Direct)], &[]),
        ]);
        let events = of_route_change("home-a", was_relayed.as_ref(), &direct);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, route_reason::DIRECT);
        assert_eq!(
            events[0].note.as_deref(),
            Some("home-b direct (was via cloud): neither side reports the other unreachable")
        );
        assert!(of_route_change("home-a", None, &direct).is_empty(), "a new member's direct pairs");
        // Unreachable with no relay: a Warning.
        let lost = BTreeMap::from([
            member("home-a", &[("home-b", PeerRoute::Unreachable)], &[("home-b", Reach::Unreachable)]),
            member("home-b", &[("home-a", PeerRoute::Unreachable)], &[]),
        ]);
        let events = of_route_change("home-a", was_relayed.as_ref(), &lost);
        assert_eq!((events[0].type_, events[0].reason.as_str()), (EventType::Warning, route_reason::UNREACHABLE));
        assert_eq!(
            events[0].note.as_deref(),
            Some(
                "home-b unreachable (was via cloud): home-a reports home-b unreachable, and no relay both reach directly"
            )
        );
        assert_eq!(stored(""), None, "not JSON: as if absent");
    }

    #[test]
    fn an_intercept_gets_events_only_on_change() {
        use intercept_reason as r;
        let reasons = |e: &[Event]| e.iter().map(|e| (e.type_, e.reason.clone())).collect::<Vec<_>>();
        // Programmed turning True: one Normal event, then none while it stays True.
        let pending = intercept(("True", r::ACCEPTED), "False", &[("app", r::PENDING)]);
        let done = intercept(("True", r::ACCEPTED), "True", &[]);
        assert!(of_intercept_change("ns", None, &pending).is_empty(), "Pending is no event");
        assert_eq!(
            reasons(&of_intercept_change("ns", Some(&pending), &done)),
            [(EventType::Normal, r::PROGRAMMED.into())]
        );
        assert!(of_intercept_change("ns", Some(&done), &done).is_empty());
        // A pod refused: one Warning naming the pod, its node and the reason; once.
        let refused = intercept(("True", r::ACCEPTED), "False", &[("app", r::NAMESPACE_NOT_FOUND)]);
        let events = of_intercept_change("ns", Some(&done), &refused);
        assert_eq!(reasons(&events), [(EventType::Warning, r::NAMESPACE_NOT_FOUND.into())]);
        assert_eq!(events[0].note.as_deref(), Some("pod app on node worker-1: why"));
        let pod = events[0].secondary.as_ref().and_then(|o| o.name.clone());
        assert_eq!(pod.as_deref(), Some("app"));
        assert!(of_intercept_change("ns", Some(&refused), &refused).is_empty(), "said once");
        // Accepted turning False: one Warning with its reason, not one per pod it leaves out.
        let bad =
            intercept(("False", r::INVALID_SUBNET), "False", &[("app", r::NOT_ACCEPTED), ("db", r::NOT_ACCEPTED)]);
        let events = of_intercept_change("ns", Some(&done), &bad);
        assert_eq!(reasons(&events), [(EventType::Warning, r::INVALID_SUBNET.into())]);
        assert_eq!(events[0].note.as_deref(), Some("Accepted InvalidSubnet"));
        assert!(of_intercept_change("ns", Some(&bad), &bad).is_empty());
        // At most MAX_POD_EVENTS pod events per write.
        let names: Vec<String> = (0..3 * MAX_POD_EVENTS).map(|i| format!("p{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), r::NOT_RUNNING)).collect();
        let events = of_intercept_change("ns", Some(&done), &intercept(("True", r::ACCEPTED), "False", &many));
        assert_eq!(events.len(), MAX_POD_EVENTS);
    }
}
