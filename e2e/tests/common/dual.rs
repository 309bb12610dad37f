//! Probes of either family: a client dials an IPv4 or an IPv6 published address and must see
//! its own address of that family at the pod, the reply from the address it dialed.

use std::net::SocketAddr;

use kuport_lab::probe::{Answer, parse_target};
use kuport_lab::{Lab, Protocol};

/// The client's address of `to`'s family (its `address6` for IPv6).
pub fn own_address(lab: &Lab, client: &str, to: SocketAddr) -> std::net::IpAddr {
    lab.client_address_like(client, to.ip())
        .unwrap_or_else(|| panic!("{client} has no address of {to}'s family in the topology"))
}

/// The pod saw the client's own address (of the family dialed) and port; the reply came from
/// the address dialed.
pub fn assert_intact_any(lab: &Lab, client: &str, a: &Answer<SocketAddr>, pod: &str) {
    let own = own_address(lab, client, a.dialed);
    assert_eq!(a.pod, pod, "the wrong pod answered: {a}");
    assert_eq!(a.seen.ip(), own, "{pod} did not see {client}'s own address {own}: {a}");
    assert_eq!(a.seen.port(), a.local.port(), "{pod} saw another source port than {client} sent from: {a}");
    assert_eq!(a.reply_from, a.dialed, "the reply to {client} did not come from the address it dialed: {a}");
}

/// Probes `to` (`203.0.113.9:27015` or `[2001:db8::9]:27015`) and asserts the mapping works end
/// to end.
pub fn assert_maps_any(lab: &Lab, client: &str, to: &str, proto: Protocol, pod: &str) -> Answer<SocketAddr> {
    let dial = parse_target(to).unwrap_or_else(|e| panic!("{e}"));
    let a = lab.probe_any(client, dial, proto).unwrap_or_else(|e| panic!("{client} -> {to}/{proto}: {e}"));
    assert_intact_any(lab, client, &a, pod);
    a
}
