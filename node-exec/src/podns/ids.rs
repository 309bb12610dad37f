//! Socket owners in a pod's user namespace (docs/intercept/table.md, "Pods in a user
//! namespace"). The kernel reads `meta skuid` and `meta skgid` through the user namespace that
//! owns the network namespace (nft_meta: `from_kgid_munged(sock_net(sk)->user_ns, ...)`), while
//! an Intercept names the agent's group as the pod's processes see it. When the two user
//! namespaces are one (containerd and CRI-O create a `hostUsers: false` pod's network namespace
//! inside its user namespace) the rule's ID is the pod's as sent. When the network namespace is
//! the host's user namespace's and the pod's processes run in a child user namespace, the rule
//! must carry the host-side ID, read from the pod's gid_map (uid_map for users).

use std::fs::File;
use std::path::{Path, PathBuf};

use kuport_proto::v1::{NetnsState, NftValue, Selector, nft_match, nft_value};

use super::NsId;
use crate::sys;

/// One line of a uid_map or gid_map: `inside outside count`, `outside` as this process's user
/// namespace sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// How the owner IDs of a pod's rules reach the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerIds {
    /// The kernel reads owners as the pod's processes see them: the rules go as sent.
    AsInPod,
    /// The namespace belongs to this process's user namespace and the pod's processes run in
    /// another: each ID is mapped through that one's maps.
    Mapped { uid: Vec<IdRange>, gid: Vec<IdRange> },
    /// Owned by a user namespace that is neither the host's nor the pod's processes'.
    Foreign,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("the agent's {what} {id} is not mapped in the pod's user namespace")]
    Unmapped { what: &'static str, id: u32 },
    #[error(
        "the pod's network namespace belongs to a user namespace that is neither the host's nor its processes', so a socket owner cannot be matched; use agent.mark"
    )]
    Foreign,
}

/// Parses a uid_map or gid_map.
pub fn parse_map(text: &str) -> Vec<IdRange> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|w| w.parse::<u32>().ok());
            Some(IdRange { inside: f.next()??, outside: f.next()??, count: f.next()?? })
        })
        .collect()
}

/// `id` as seen inside, mapped to outside.
fn map(ranges: &[IdRange], id: u32) -> Option<u32> {
    ranges.iter().find(|r| id >= r.inside && id - r.inside < r.count).map(|r| r.outside + (id - r.inside))
}

impl OwnerIds {
    /// The ID a rule must carry for the pod's `id` (a uid if `user`, else a gid).
    pub fn translate(&self, user: bool, id: u32) -> Result<u32, IdError> {
        match self {
            OwnerIds::AsInPod => Ok(id),
            OwnerIds::Mapped { uid, gid } => {
                let (ranges, what) = if user { (uid, "user") } else { (gid, "group") };
                map(ranges, id).ok_or(IdError::Unmapped { what, id })
            }
            OwnerIds::Foreign => Err(IdError::Foreign),
        }
    }

    /// [`OwnerIds::apply`], or None (no copy) when the owners need nothing: the host's state
    /// can hold 50,000 mappings.
    pub fn apply_if_needed(&self, state: &NetnsState) -> Result<Option<NetnsState>, IdError> {
        if *self == OwnerIds::AsInPod { Ok(None) } else { self.apply(state).map(Some) }
    }

    /// `state` with every `meta skuid` and `meta skgid` ID translated; unchanged when the
    /// owners need nothing.
    pub fn apply(&self, state: &NetnsState) -> Result<NetnsState, IdError> {
        let mut out = state.clone();
        if *self == OwnerIds::AsInPod {
            return Ok(out);
        }
        for rule in out.nft_tables.iter_mut().flat_map(|t| t.chains.iter_mut()).flat_map(|c| c.rules.iter_mut()) {
            for m in &mut rule.matches {
                match &mut m.kind {
                    Some(nft_match::Kind::Compare(c)) => self.value(c.selector, c.value.as_mut())?,
                    Some(nft_match::Kind::Literal(l)) => {
                        for v in &mut l.values {
                            self.value(l.selector, Some(v))?;
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    fn value(&self, selector: i32, value: Option<&mut NftValue>) -> Result<(), IdError> {
        let user = match Selector::try_from(selector) {
            Ok(Selector::MetaSkuid) => true,
            Ok(Selector::MetaSkgid) => false,
            _ => return Ok(()),
        };
        if let Some(NftValue { value: Some(nft_value::Value::Id(id)) }) = value {
            *id = self.translate(user, *id)?;
        }
        Ok(())
    }
}

/// The owner translation for the network namespace open as `netns` (identity `id`): its owning
/// user namespace against the one its processes run in (`pid` first, when the runtime named
/// the sandbox's process). Anything unreadable (an old kernel, a process that just ended)
/// leaves the IDs as sent.
pub fn owner_ids(netns: &File, id: NsId, pid: Option<u32>) -> OwnerIds {
    let Ok(owner) = sys::userns::owner(netns).and_then(|f| NsId::of(&fd_path(&f))) else {
        return OwnerIds::AsInPod;
    };
    let Ok(ours) = NsId::of(Path::new("/proc/self/ns/user")) else { return OwnerIds::AsInPod };
    let Some((pod_userns, pod_pid)) = pod_user_namespace(id, pid, ours) else { return OwnerIds::AsInPod };
    if pod_userns == owner {
        return OwnerIds::AsInPod;
    }
    if owner != ours {
        return OwnerIds::Foreign;
    }
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pod_pid}/{f}")).map(|t| parse_map(&t));
    match (read("uid_map"), read("gid_map")) {
        (Ok(uid), Ok(gid)) => OwnerIds::Mapped { uid, gid },
        _ => OwnerIds::AsInPod,
    }
}

fn fd_path(f: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// The user namespace of the pod's processes (those in network namespace `netns`) and one of
/// them: `pid` when it is in `netns`; else the one user namespace other than `ours` they run
/// in, or `ours` when all do. None: no process is in it, or they run in several.
fn pod_user_namespace(netns: NsId, pid: Option<u32>, ours: NsId) -> Option<(NsId, u32)> {
    let in_netns = |p: u32| NsId::of(Path::new(&format!("/proc/{p}/ns/net"))).is_ok_and(|n| n == netns);
    let userns = |p: u32| NsId::of(Path::new(&format!("/proc/{p}/ns/user"))).ok();
    if let Some(p) = pid.filter(|p| in_netns(*p)) {
        return userns(p).map(|u| (u, p));
    }
    let mut found: Vec<(NsId, u32)> = Vec::new();
    let dir = std::fs::read_dir("/proc").ok()?;
    for p in dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())) {
        if in_netns(p)
            && let Some(u) = userns(p)
            && !found.iter().any(|(f, _)| *f == u)
        {
            found.push((u, p));
        }
    }
    let others: Vec<(NsId, u32)> = found.iter().copied().filter(|(u, _)| *u != ours).collect();
    match (&others[..], &found[..]) {
        ([one], _) => Some(*one),
        ([], [one]) => Some(*one),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_proto::v1::{Compare, LiteralSet, NftChain, NftMatch, NftRule, NftTable};

    #[test]
    fn ids_map_through_the_pods_ranges() {
        let ranges = parse_map("         0     200000      65536\n 70000 300000 10\nbad line\n");
        assert_eq!(ranges.len(), 2);
        let ids = OwnerIds::Mapped { uid: ranges.clone(), gid: ranges };
        assert_eq!(ids.translate(false, 7439), Ok(207_439));
        assert_eq!(ids.translate(true, 0), Ok(200_000));
        assert_eq!(ids.translate(false, 70_009), Ok(300_009));
        assert_eq!(ids.translate(false, 65_536), Err(IdError::Unmapped { what: "group", id: 65_536 }));
        assert_eq!(OwnerIds::AsInPod.translate(false, 7439), Ok(7439));
        assert_eq!(OwnerIds::Foreign.translate(true, 0), Err(IdError::Foreign));
    }

    #[test]
    fn only_owner_ids_in_rules_change() {
        let compare = |selector: Selector, v: NftValue| NftMatch {
            kind: Some(nft_match::Kind::Compare(Compare {
                selector: selector as i32,
                value: Some(v),
                ..Default::default()
            })),
        };
        let rule = NftRule {
            matches: vec![
                compare(Selector::MetaSkgid, kuport_proto::build::id(7439)),
                compare(Selector::MetaSkuid, kuport_proto::build::id(0)),
                compare(Selector::MetaMark, kuport_proto::build::mark(7439)),
                NftMatch {
                    kind: Some(nft_match::Kind::Literal(LiteralSet {
                        selector: Selector::MetaSkgid as i32,
                        values: vec![kuport_proto::build::id(1)],
                        negate: false,
                    })),
                },
            ],
            statements: vec![],
        };
        let chain = NftChain { name: "output".into(), rules: vec![rule], ..Default::default() };
        let state = NetnsState {
            nft_tables: vec![NftTable { chains: vec![chain].into(), ..Default::default() }].into(),
            ..Default::default()
        };
        let range = vec![IdRange { inside: 0, outside: 200_000, count: 65_536 }];
        let out = OwnerIds::Mapped { uid: range.clone(), gid: range }.apply(&state).expect("mapped");
        let values: Vec<_> = out.nft_tables[0].chains[0].rules[0]
            .matches
            .iter()
            .map(|m| match &m.kind {
                Some(nft_match::Kind::Compare(c)) => c.value.clone(),
                Some(nft_match::Kind::Literal(l)) => l.values.first().cloned(),
                _ => None,
            })
            .collect();
        assert_eq!(
            values,
            [
                Some(kuport_proto::build::id(207_439)),
                Some(kuport_proto::build::id(200_000)),
                Some(kuport_proto::build::mark(7439)),
                Some(kuport_proto::build::id(200_001)),
            ]
        );
        assert_eq!(OwnerIds::AsInPod.apply(&state).expect("as sent"), state);
        assert_eq!(OwnerIds::Foreign.apply(&state), Err(IdError::Foreign));
    }
}
