//! Links: kuport's `kup-*` VXLAN links, one per name. Changed in place where the kernel allows
//! it (MTU, MAC, local, remote, TTL, up), deleted and created again where it does not (VNI, port, or
//! a link of another kind under the name).

use std::{collections::BTreeSet, net::Ipv4Addr};

use netlink_packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::LinkVxlan;

use super::{
    KindPlan,
    consts::owns_link,
    diff::{Change, Difference},
    error::Op,
    model::{Desired, LinkSpec, Mac},
    observe::{Observed, ObservedLink},
    session::Session,
};

/// A link that exists and can be brought to the desired state in place (one RTM_NEWLINK).
#[derive(Debug)]
pub(crate) struct LinkChange {
    pub spec: LinkSpec,
    pub index: u32,
    pub mtu: Option<u32>,
    /// A MAC that differs: set in place (a VXLAN device takes a live address change).
    pub mac: Option<Mac>,
    pub local: Option<Option<Ipv4Addr>>,
    pub remote: Option<Option<Ipv4Addr>>,
    pub ttl: Option<u8>,
    pub up: bool,
    /// What differs, for the report.
    pub how: Vec<String>,
}

/// A link that must be deleted and created again: the kernel refuses to change these attributes
/// of a VXLAN link in place ("Cannot change VNI", "Cannot change port"), or it is another kind.
#[derive(Debug)]
pub(crate) struct LinkRecreate {
    pub spec: LinkSpec,
    pub index: u32,
    pub how: Vec<String>,
}

/// What making and breaking the links takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub creates: Vec<LinkSpec>,
    pub changes: Vec<LinkChange>,
    pub recreates: Vec<LinkRecreate>,
    /// kuport's links the desired state does not name.
    pub dels: Vec<ObservedLink>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
        let mut plan = Plan::default();
        for spec in &desired.links {
            let Some(have) = observed.link(&spec.name) else {
                plan.creates.push(spec.clone());
                continue;
            };
            let want = &spec.vxlan;
            let Some(vx) = have.vxlan.as_ref().filter(|_| have.kind.as_deref() == Some("vxlan")) else {
                let kind = have.kind.as_deref().unwrap_or("none");
                plan.recreates.push(LinkRecreate {
                    spec: spec.clone(),
                    index: have.index,
                    how: vec![format!("kind {kind} -> vxlan")],
                });
                continue;
            };
            let mut fixed = Vec::new();
            if vx.vni != want.vni {
                fixed.push(format!("vni {} -> {}", vx.vni, want.vni));
            }
            if let Some(port) = want.dstport.filter(|p| *p != vx.dstport) {
                fixed.push(format!("dstport {} -> {port}", vx.dstport));
            }
            if !fixed.is_empty() {
                plan.recreates.push(LinkRecreate { spec: spec.clone(), index: have.index, how: fixed });
                continue;
            }
            let mut ch = LinkChange {
                spec: spec.clone(),
                index: have.index,
                mtu: None,
                mac: None,
                local: None,
                remote: None,
                ttl: None,
                up: false,
                how: Vec::new(),
            };
            if let Some(mtu) = spec.mtu.filter(|m| *m != have.mtu) {
                ch.how.push(format!("mtu {} -> {mtu}", have.mtu));
                ch.mtu = Some(mtu);
            }
            if let Some(mac) = spec.mac.filter(|m| have.mac.as_deref() != Some(&m.0[..])) {
                ch.how.push(format!("address {} -> {mac}", mac_text(have.mac.as_deref())));
                ch.mac = Some(mac);
            }
            if vx.local != want.local {
                ch.how.push(format!("local {} -> {}", opt(vx.local), opt(want.local)));
                ch.local = Some(want.local);
            }
            if vx.remote != want.remote {
                ch.how.push(format!("remote {} -> {}", opt(vx.remote), opt(want.remote)));
                ch.remote = Some(want.remote);
            }
            let ttl = want.ttl.unwrap_or(0);
            if vx.ttl != ttl {
                ch.how.push(format!("ttl {} -> {ttl}", vx.ttl));
                ch.ttl = Some(ttl);
            }
            if !have.admin_up {
                ch.how.push("down -> up".into());
                ch.up = true;
            }
            if !ch.how.is_empty() {
                plan.changes.push(ch);
            }
        }
        let wanted: BTreeSet<&str> = desired.links.iter().map(|l| l.name.as_str()).collect();
        plan.dels = observed
            .links
            .iter()
            .filter(|l| owns_link(&l.name) && !wanted.contains(l.name.as_str()) && !desired.is_wireguard(&l.name))
            .cloned()
            .collect();
        plan
    }

    /// Desired links that are absent or differ.
    fn missing(&self, out: &mut Vec<Difference>) {
        for s in &self.creates {
            out.push(Difference { object: s.to_string(), change: Change::Missing });
        }
        for r in &self.recreates {
            out.push(Difference { object: r.spec.to_string(), change: Change::Changed(r.how.join(", ")) });
        }
        for c in &self.changes {
            out.push(Difference { object: c.spec.to_string(), change: Change::Changed(c.how.join(", ")) });
        }
    }

    /// kuport's links no longer desired.
    fn extra(&self, out: &mut Vec<Difference>) {
        for l in &self.dels {
            out.push(Difference { object: format!("link {}", l.name), change: Change::Extra });
        }
    }

    /// Recreates, creates and changes links; the next observation dumps again if anything was
    /// written.
    fn make(&self, s: &mut Session) {
        let before = s.written();
        for r in &self.recreates {
            // The kernel cannot change these in place; the link's routes come back with theirs.
            let object = format!("{} ({})", r.spec, r.how.join(", "));
            let del = s.handle().link().del(r.index).execute();
            if s.write(Op::Delete, object, del) {
                create(s, &r.spec);
            }
        }
        for spec in &self.creates {
            create(s, spec);
        }
        for ch in &self.changes {
            change(s, ch);
        }
        if s.written() > before {
            s.stale();
        }
    }

    /// Deletes the links no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for l in &self.dels {
            let req = s.handle().link().del(l.index).execute();
            if !s.write(Op::Delete, format!("link {}", l.name), req) {
                return false;
            }
        }
        true
    }
}

fn create(s: &mut Session, spec: &LinkSpec) {
    let vx = &spec.vxlan;
    let mut b = LinkVxlan::new(&spec.name, vx.vni);
    if let Some(local) = vx.local {
        b = b.local(local);
    }
    if let Some(remote) = vx.remote {
        b = b.remote(remote);
    }
    if let Some(port) = vx.dstport {
        b = b.port(port);
    }
    if let Some(ttl) = vx.ttl {
        b = b.ttl(ttl);
    }
    if let Some(mtu) = spec.mtu {
        b = b.mtu(mtu);
    }
    if let Some(mac) = spec.mac {
        b = b.address(mac.0.to_vec());
    }
    let req = s.handle().link().add(b.up().build()).execute();
    s.write(Op::Add, spec.to_string(), req);
}

/// RTM_NEWLINK on the existing ifindex carrying only what differs: the kernel's vxlan
/// changelink takes a new local, remote and ttl in place (and refuses any port attribute, so
/// none is sent). It also refuses IFLA_MTU next to VXLAN data ("Cannot change mtu"), so a new
/// MTU with new VXLAN data goes in a message of its own, after it.
fn change(s: &mut Session, ch: &LinkChange) {
    let mut msg = LinkMessage::default();
    msg.header.index = ch.index;
    if ch.up {
        msg.header.flags |= LinkFlags::Up;
        msg.header.change_mask |= LinkFlags::Up;
    }
    let data_changes = ch.local.is_some() || ch.remote.is_some() || ch.ttl.is_some();
    if let Some(mtu) = ch.mtu.filter(|_| !data_changes) {
        msg.attributes.push(LinkAttribute::Mtu(mtu));
    }
    if let Some(mac) = ch.mac {
        msg.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    let mut data = Vec::new();
    if let Some(local) = ch.local {
        data.push(InfoVxlan::Local(local.unwrap_or(Ipv4Addr::UNSPECIFIED)));
    }
    if let Some(remote) = ch.remote {
        data.push(InfoVxlan::Group(remote.unwrap_or(Ipv4Addr::UNSPECIFIED)));
    }
    if let Some(ttl) = ch.ttl {
        data.push(InfoVxlan::Ttl(ttl));
    }
    if !data.is_empty() {
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vxlan),
            LinkInfo::Data(InfoData::Vxlan(data)),
        ]));
    }
    let object = format!("{} ({})", ch.spec, ch.how.join(", "));
    let req = s.handle().link().change(msg).execute();
    s.write(Op::Change, object.clone(), req);
    if let Some(mtu) = ch.mtu.filter(|_| data_changes) {
        let mut msg = LinkMessage::default();
        msg.header.index = ch.index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        let req = s.handle().link().change(msg).execute();
        s.write(Op::Change, object, req);
    }
}

fn mac_text(mac: Option<&[u8]>) -> String {
    match mac {
        None => "none".into(),
        Some(m) => m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"),
    }
}

fn opt(a: Option<Ipv4Addr>) -> String {
    a.map_or_else(|| "none".into(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtnl::{model::VxlanSpec, observe::ObservedVxlan};

    fn spec() -> LinkSpec {
        LinkSpec {
            name: "kup-1".into(),
            mtu: Some(1370),
            mac: Some(Mac([2, 0, 0, 0, 0, 1])),
            vxlan: VxlanSpec {
                vni: 4201,
                local: Some("10.99.0.1".parse().expect("addr")),
                remote: Some("10.99.0.2".parse().expect("addr")),
                dstport: Some(4790),
                ttl: Some(64),
            },
        }
    }

    fn vx() -> ObservedVxlan {
        ObservedVxlan {
            vni: 4201,
            local: Some("10.99.0.1".parse().expect("addr")),
            remote: Some("10.99.0.2".parse().expect("addr")),
            dstport: 4790,
            ttl: 64,
        }
    }

    fn link(index: u32, name: &str, vxlan: Option<ObservedVxlan>) -> ObservedLink {
        ObservedLink {
            index,
            name: name.into(),
            mtu: 1370,
            admin_up: true,
            oper_state: "UNKNOWN".into(),
            kind: vxlan.as_ref().map(|_| "vxlan".into()),
            vxlan,
            mac: Some(vec![2, 0, 0, 0, 0, 1]),
        }
    }

    #[test]
    fn in_place_changes_and_recreations_are_told_apart() {
        let mut have = vx();
        have.remote = Some("10.99.0.9".parse().expect("addr"));
        have.ttl = 0;
        let mut l = link(2, "kup-1", Some(have));
        l.mtu = 1500;
        l.admin_up = false;
        l.mac = Some(vec![0x6e, 1, 2, 3, 4, 5]);
        let observed = Observed { links: vec![l], ..Default::default() };
        let desired = Desired { links: vec![spec()], ..Default::default() };
        let p = Plan::new(&desired, &observed);
        assert!(p.recreates.is_empty() && p.creates.is_empty());
        assert_eq!(
            p.changes[0].how,
            [
                "mtu 1500 -> 1370",
                "address 6e:01:02:03:04:05 -> 02:00:00:00:00:01",
                "remote 10.99.0.9 -> 10.99.0.2",
                "ttl 0 -> 64",
                "down -> up"
            ]
        );

        let mut other_port = vx();
        other_port.dstport = 8472;
        let observed = Observed { links: vec![link(2, "kup-1", Some(other_port))], ..Default::default() };
        let p = Plan::new(&desired, &observed);
        assert!(p.changes.is_empty());
        assert_eq!(p.recreates[0].how, ["dstport 8472 -> 4790"]);
    }
}
