//! Noticing outside changes: a subscription to rtnetlink's link, address, neighbour, route and
//! rule multicast groups (IPv4 and IPv6) inside a namespace. Each notification only says something changed;
//! the caller re-reads and re-diffs. Neighbour events are passed on only for `kup-*` links: a
//! host's other entries change state all the time (REACHABLE, STALE, ...) and are never ours.

use std::{collections::BTreeSet, path::Path};

use futures::{StreamExt, TryStreamExt};
use rtnetlink::{
    MulticastGroup,
    packet_core::NetlinkPayload,
    packet_route::{
        RouteNetlinkMessage,
        link::{LinkAttribute, LinkMessage},
    },
};
use tokio::sync::{mpsc, oneshot};

use super::{error::Error, netns};

/// The groups kuport's objects live in.
const GROUPS: [MulticastGroup; 8] = [
    MulticastGroup::Link,
    MulticastGroup::Ipv4Ifaddr,
    MulticastGroup::Ipv6Ifaddr,
    MulticastGroup::Neigh,
    MulticastGroup::Ipv4Route,
    MulticastGroup::Ipv6Route,
    MulticastGroup::Ipv4Rule,
    MulticastGroup::Ipv6Rule,
];

/// What kind of object an event was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Link,
    Address,
    /// A neighbour entry on one of kuport's links.
    Neighbour,
    Route,
    Rule,
    /// Something else arrived (or the socket reported an error, e.g. lost events): re-read.
    Other,
}

/// One change the kernel announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    pub subject: Subject,
    /// A deletion (RTM_DEL*) rather than an addition or change.
    pub removed: bool,
}

/// A live subscription; dropping it stops its thread.
#[derive(Debug)]
pub struct Subscription {
    events: mpsc::UnboundedReceiver<Notification>,
    _stop: oneshot::Sender<()>,
}

impl Subscription {
    /// The next change; None once the subscription has failed.
    pub async fn recv(&mut self) -> Option<Notification> {
        self.events.recv().await
    }

    /// A change that already arrived, without waiting.
    pub fn try_recv(&mut self) -> Option<Notification> {
        self.events.try_recv().ok()
    }

    /// Discards every change that already arrived (e.g. those an apply itself caused); returns
    /// how many there were.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        while self.events.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

/// Subscribes to link, address, neighbour, route and rule changes of both families in `netns`
/// (None: the caller's).
///
/// The socket is bound inside the namespace by a dedicated thread, which then forwards events
/// until the [`Subscription`] is dropped. Returns once the socket listens, so any change made after
/// this returns is reported.
pub fn subscribe(netns: Option<&Path>) -> Result<Subscription, Error> {
    let target = netns::open(netns)?;
    let path = netns.map(Path::to_path_buf);
    let (tx, events) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let (ready_tx, ready) = std::sync::mpsc::channel::<Result<(), Error>>();

    std::thread::Builder::new()
        .name("kuport-netwatch".into())
        .spawn(move || {
            if let (Some(file), Some(path)) = (&target, &path)
                && let Err(e) = netns::enter(file, path)
            {
                let _ = ready_tx.send(Err(e));
                return;
            }
            let rt = match netns::runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(forward(tx, stopped, ready_tx));
        })
        .map_err(|source| Error::Io { what: "spawning the watch thread", source })?;

    match ready.recv() {
        Ok(Ok(())) => Ok(Subscription { events, _stop: stop }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Io { what: "watch thread", source: std::io::Error::other("ended before listening") }),
    }
}

async fn forward(
    tx: mpsc::UnboundedSender<Notification>,
    mut stopped: oneshot::Receiver<()>,
    ready: std::sync::mpsc::Sender<Result<(), Error>>,
) {
    let (conn, handle, mut messages) = match rtnetlink::new_multicast_connection(&GROUPS) {
        Ok(c) => c,
        Err(source) => {
            let _ = ready.send(Err(Error::Io { what: "subscribing to rtnetlink groups", source }));
            return;
        }
    };
    let conn = tokio::spawn(conn);
    // kuport's links by index, so that only their neighbour events count; kept from link events.
    let mut ours = BTreeSet::new();
    match handle.link().get().execute().try_collect::<Vec<LinkMessage>>().await {
        Ok(links) => {
            for l in &links {
                track(&mut ours, l, false);
            }
        }
        Err(e) => {
            let _ = ready.send(Err(Error::Io {
                what: "listing links for the watch",
                source: std::io::Error::other(e.to_string()),
            }));
            conn.abort();
            return;
        }
    }
    let _ = ready.send(Ok(()));
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            msg = messages.next() => {
                let Some((msg, _)) = msg else { break };
                let Some(n) = classify(&msg.payload, &mut ours) else { continue };
                if tx.send(n).is_err() {
                    break;
                }
            }
        }
    }
    conn.abort();
}

/// Adds a `kup-*` link's index to `ours`, or removes it.
fn track(ours: &mut BTreeSet<u32>, l: &LinkMessage, removed: bool) {
    let name = l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    });
    if removed {
        ours.remove(&l.header.index);
    } else if name.is_some_and(super::consts::owns_link) {
        ours.insert(l.header.index);
    }
}

/// What a message announces; None for a neighbour event on a link that is not kuport's.
fn classify(payload: &NetlinkPayload<RouteNetlinkMessage>, ours: &mut BTreeSet<u32>) -> Option<Notification> {
    use RouteNetlinkMessage as M;
    let (subject, removed) = match payload {
        NetlinkPayload::InnerMessage(m) => match m {
            M::NewLink(l) => {
                track(ours, l, false);
                (Subject::Link, false)
            }
            M::DelLink(l) => {
                track(ours, l, true);
                (Subject::Link, true)
            }
            M::NewAddress(_) => (Subject::Address, false),
            M::DelAddress(_) => (Subject::Address, true),
            M::NewNeighbour(n) | M::DelNeighbour(n) if !ours.contains(&n.header.ifindex) => return None,
            M::NewNeighbour(_) => (Subject::Neighbour, false),
            M::DelNeighbour(_) => (Subject::Neighbour, true),
            M::NewRoute(_) => (Subject::Route, false),
            M::DelRoute(_) => (Subject::Route, true),
            M::NewRule(_) => (Subject::Rule, false),
            M::DelRule(_) => (Subject::Rule, true),
            _ => (Subject::Other, false),
        },
        _ => (Subject::Other, false),
    };
    Some(Notification { subject, removed })
}
