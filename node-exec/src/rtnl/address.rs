//! Addresses: IPv4 addresses on kuport's links, one per link and prefix.

use std::net::IpAddr;

use super::{
    KindPlan,
    consts::owns_link,
    diff::{Change, Difference},
    error::Op,
    model::{AddressSpec, Desired},
    observe::{Observed, ObservedAddress},
    session::Session,
};

/// What making and breaking the addresses takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub adds: Vec<AddressSpec>,
    /// Addresses on kuport's links the desired state does not name.
    pub dels: Vec<ObservedAddress>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
        let has = |a: &AddressSpec| observed.addresses.iter().any(|o| o.dev == a.dev && o.net == a.net);
        Plan {
            adds: desired.addresses.iter().filter(|a| !has(a)).cloned().collect(),
            dels: observed
                .addresses
                .iter()
                .filter(|o| owns_link(&o.dev))
                .filter(|o| !desired.addresses.iter().any(|a| a.dev == o.dev && a.net == o.net))
                .cloned()
                .collect(),
        }
    }

    fn missing(&self, out: &mut Vec<Difference>) {
        for a in &self.adds {
            out.push(Difference { object: a.to_string(), change: Change::Missing });
        }
    }

    fn extra(&self, out: &mut Vec<Difference>) {
        for a in &self.dels {
            out.push(Difference { object: name(a), change: Change::Extra });
        }
    }

    /// Adds the missing addresses, on the links as last observed.
    fn make(&self, s: &mut Session) {
        for a in &self.adds {
            let Some(index) = s.index(a, &a.dev) else { continue };
            let req = s.handle().address().add(index, IpAddr::V4(a.net.addr()), a.net.prefix_len()).execute();
            s.write(Op::Add, a.to_string(), req);
        }
    }

    /// Deletes the addresses no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for a in &self.dels {
            let req = s.handle().address().del(a.msg.clone()).execute();
            if !s.write(Op::Delete, name(a), req) {
                return false;
            }
        }
        true
    }
}

fn name(a: &ObservedAddress) -> String {
    format!("address {} dev {}", a.net, a.dev)
}
