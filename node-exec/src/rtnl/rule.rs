//! Policy rules: kuport's rules sit at its preferences with a mark under its prefix; one is the
//! same as another when family, preference, mark, mask, destination and table all match. The
//! ownership test is the same for IPv4 and IPv6 rules.

use netlink_packet_route::{
    AddressFamily,
    rule::{RuleAction, RuleAttribute},
};

use super::{
    KindPlan,
    consts::owns_rule,
    diff::{Change, Difference},
    error::Op,
    model::{Desired, RuleSpec, RuleWord, TableName},
    observe::{Observed, ObservedRule},
    session::Session,
};

/// What making and breaking the rules takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub adds: Vec<RuleSpec>,
    /// kuport's rules the desired state does not have (each observed rule answers one desired).
    pub dels: Vec<ObservedRule>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
        let mut plan = Plan::default();
        let mut used = vec![false; observed.rules.len()];
        for spec in &desired.rules {
            let found = observed.rules.iter().enumerate().find(|(i, o)| !used[*i] && o.plain && is(o, spec));
            match found {
                Some((i, _)) => used[i] = true,
                None => plan.adds.push(spec.clone()),
            }
        }
        plan.dels = observed
            .rules
            .iter()
            .enumerate()
            .filter(|(i, o)| !used[*i] && owns_rule(o.pref, o.fwmark))
            .map(|(_, o)| o.clone())
            .collect();
        plan
    }

    fn missing(&self, out: &mut Vec<Difference>) {
        for r in &self.adds {
            out.push(Difference { object: r.to_string(), change: Change::Missing });
        }
    }

    fn extra(&self, out: &mut Vec<Difference>) {
        for r in &self.dels {
            out.push(Difference { object: name(r), change: Change::Extra });
        }
    }

    fn make(&self, s: &mut Session) {
        for r in &self.adds {
            // v4() and v6() differ only in the header's family; the destination is set by hand so
            // one request serves both.
            let mut req = s
                .handle()
                .rule()
                .add()
                .v4()
                .priority(r.pref)
                .fw_mark(r.fwmark)
                .table_id(r.table)
                .action(RuleAction::ToTable);
            let msg = req.message_mut();
            if r.ipv6 {
                msg.header.family = AddressFamily::Inet6;
            }
            if let Some(to) = r.to {
                msg.header.dst_len = to.prefix_len();
                msg.attributes.push(RuleAttribute::Destination(to.addr()));
            }
            msg.attributes.push(RuleAttribute::FwMask(r.fwmask));
            s.write(Op::Add, r.to_string(), req.execute());
        }
    }

    /// Deletes kuport's rules no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for r in &self.dels {
            let req = s.handle().rule().del(r.msg.clone()).execute();
            if !s.write(Op::Delete, name(r), req) {
                return false;
            }
        }
        true
    }
}

fn is(o: &ObservedRule, s: &RuleSpec) -> bool {
    o.ipv6 == s.ipv6
        && o.pref == s.pref
        && o.fwmark == s.fwmark
        && o.fwmask == s.fwmask
        && o.to == s.to
        && o.table == s.table
}

/// An observed rule named as `ip` would name it.
fn name(o: &ObservedRule) -> String {
    let mut s = format!("{} pref {} fwmark {:#x}/{:#x}", RuleWord(o.ipv6), o.pref, o.fwmark, o.fwmask);
    if let Some(to) = o.to {
        s += &format!(" to {to}");
    }
    s += &format!(" lookup {}", TableName(o.table));
    if !o.plain {
        s += " (with other selectors)";
    }
    s
}
