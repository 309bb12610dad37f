//! A change that reaches a few mappings, made into the compute before (docs/design.md,
//! "Compute by change"): those mappings are placed, linked and stated again, the nodes their
//! contributions moved are rendered again, and everything else is the last compute's.
//!
//! It holds only where a whole compute would make every other mapping the same:
//! - admission read no change but in PortMaps ([`Since::judged`]), and no class spec changed;
//!   a mapping whose verdict is another now is reached too, and a mapping gone is taken away;
//! - the class rows are as the last compute made them and no link is due for release, so the
//!   links needed keep their numbers and a link needed anew is claimed as a whole compute
//!   claims it ([`links::Allocation::changed`]);
//! - no other mapping answers from a pod port a reached mapping held or holds (the
//!   one-way-return check reads across mappings).
//!
//! Otherwise [`patch`] gives up and the whole compute runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::admission::{self, Accepted, MapKey};
use super::placement::{Endpoint, Placement};
use super::status::Refusal;
use super::{
    Built, ClassVxlans, Judged, Linked, PodPort, Since, class_status, cleared, contribution, datapath, device, link,
    needs, needs_of, place, pod_port, seeded, stated,
};
use crate::compute::Outputs;
use crate::observe::Cluster;
use crate::observe::index::View;

/// A placement as the compute before made it: what admission accepted, the pod, the
/// programming nodes.
type Was<'l> = (Arc<Accepted>, &'l Endpoint, &'l BTreeMap<String, Vec<String>>);

/// One mapping a change reached: what it was, and what it is now.
struct Reached<'a> {
    at: usize,
    was: Option<&'a super::Kept>,
    /// Its placement as the compute before made it.
    old: Option<Was<'a>>,
    judged: Option<Arc<Judged>>,
    /// The compute before's links, where the placement is kept.
    linked: Option<Arc<Linked>>,
}

/// The compute before with the mappings this change reached made again, or None where a whole
/// compute could make any other mapping differently (the module's list).
pub(super) fn patch<'a>(
    view: &View<'a>,
    cluster: &'a Cluster,
    since: &Since,
    vxlan: &ClassVxlans,
    out: &mut Outputs,
) -> Option<Built> {
    let last = since.built;
    let (namespaces, restated) = (since.namespaces.as_ref()?, since.restated.as_ref()?);
    if since.classes || !since.clock_holds {
        return None;
    }
    // The allocation reads the class rows: as made, they give the same links the same numbers.
    let as_made = view.classes.len() == last.made.classes.len()
        && view.classes.iter().all(|(name, c)| {
            last.made.classes.get(name).is_some_and(|made| {
                c.status.as_ref() == Some(made)
                    && made.conditions.iter().all(|k| k.observed_generation == c.metadata.generation)
            })
        });
    if !as_made {
        return None;
    }
    let (verdicts, admitted, moved, gone) = if since.admission {
        let r = admission::readmit_changed(view, &cluster.port_maps, &last.admitted, since.judged.as_ref()?)?;
        (r.verdicts, Arc::new(r.owned), r.moved, r.gone)
    } else {
        let verdicts = admission::readmit(view, &cluster.port_maps, &last.admitted)?;
        (verdicts, last.admitted.clone(), HashMap::new(), Vec::new())
    };
    let now = cluster.now;
    let reaches = |key: &MapKey| {
        namespaces.contains(&key.0)
            || restated.contains(&key.0)
            || (since.pods && last.across.every_pod.contains(key))
            || moved.contains_key(key)
    };
    // A mapping's placement before, with its verdict before (the one now, unless it moved).
    let was_of = |key: &MapKey, now: Option<&Arc<Accepted>>| -> Option<Was> {
        let accepted = match moved.get(key) {
            Some(before) => before.as_ref().ok()?,
            None => now?,
        };
        match &last.kept.get(key)?.judged.as_deref()?.placed {
            Ok((endpoint, nodes)) => Some((accepted.clone(), endpoint, nodes)),
            Err(_) => None,
        }
    };
    let reached_at: Vec<usize> = (0..verdicts.len()).filter(|i| reaches(&verdicts[*i].0)).collect();

    // Placed again, oldest first, each checked against the older reached ones.
    let mut every_pod = last.across.every_pod.clone();
    let (mut reached, mut placed_anew) = (Vec::with_capacity(reached_at.len()), 0);
    let mut placements = Vec::with_capacity(reached_at.len());
    for at in reached_at {
        let (key, _, admitted) = &verdicts[at];
        let was = last.kept.get(key);
        let old = was_of(key, admitted.as_ref().ok().map(|a| &a.accepted));
        let (mut judged, mut linked) = (None, None);
        every_pod.remove(key);
        let placed = admitted.clone().and_then(|a| {
            let kept = since.kept(key);
            placed_anew += usize::from(kept.is_none());
            linked = kept.as_ref().and_then(|_| was?.linked.clone());
            let (placed, kept) = place(view, a, kept);
            if kept.reads_every_pod {
                every_pod.insert(key.clone());
            }
            judged = Some(kept);
            placed
        });
        reached.push(Reached { at, was, old, judged, linked });
        placements.push(placed);
    }
    // The mappings gone: what they were.
    let gone: Vec<(&MapKey, Option<&super::Kept>, Option<Was>)> =
        gone.iter().map(|key| (key, last.kept.get(key), was_of(key, None))).collect();
    for (key, _, _) in &gone {
        every_pod.remove(*key);
    }
    let olds = || reached.iter().map(|r| (r.was, &r.old)).chain(gone.iter().map(|(_, was, old)| (*was, old)));

    // No other mapping may answer from a pod port a reached one held or holds.
    let mut pod_ports = last.across.pod_ports.clone();
    for (_, old) in olds() {
        if let Some((accepted, endpoint, _)) = old {
            let at = (endpoint.address, accepted.protocol);
            match pod_ports.get(&at)?.checked_sub(1)? {
                0 => pod_ports.remove(&at),
                n => pod_ports.insert(at, n),
            };
        }
    }
    let held: Vec<PodPort> = olds()
        .filter_map(|(_, old)| old.as_ref().map(|(a, e, _)| (e.address, a.protocol)))
        .chain(placements.iter().filter_map(|p| p.as_ref().ok()).map(pod_port))
        .collect();
    if held.iter().any(|k| pod_ports.contains_key(k)) {
        return None;
    }
    for p in placements.iter().filter_map(|p| p.as_ref().ok()) {
        *pod_ports.entry(pod_port(p)).or_default() += 1;
    }
    let mut by_pod: HashMap<PodPort, Vec<usize>> = HashMap::new();
    let mut checked: Vec<Result<Placement, Refusal>> = Vec::with_capacity(reached.len());
    for placed in placements {
        let placed = placed.and_then(|p| {
            let older = by_pod
                .get(&pod_port(&p))
                .into_iter()
                .flatten()
                .filter_map(|j| checked[*j].as_ref().ok().map(|q| (&verdicts[reached[*j].at].0, q)));
            cleared(p, older)
        });
        if let Ok(p) = &placed {
            by_pod.entry(pod_port(p)).or_default().push(checked.len());
        }
        checked.push(placed);
    }

    // The links needed: those that came are numbered, those that went keep their slot unused.
    let mut users = last.across.users.clone();
    let mut touched = BTreeSet::new();
    for (_, old) in olds().filter(|(was, _)| was.is_some_and(|k| k.cleared)) {
        let (accepted, endpoint, nodes) = old.as_ref()?;
        for key in needs_of(view, vxlan, &accepted.class_name, endpoint, nodes) {
            let n = users.get_mut(&key)?;
            *n = n.checked_sub(1)?;
            touched.insert(key);
        }
    }
    for p in checked.iter().filter_map(|p| p.as_ref().ok()) {
        for key in needs(view, vxlan, p) {
            *users.entry(key.clone()).or_default() += 1;
            touched.insert(key);
        }
    }
    let (mut came, mut went) = (BTreeSet::new(), BTreeSet::new());
    for key in touched {
        match (last.across.users.contains_key(&key), users.get(&key).is_some_and(|n| *n > 0)) {
            (false, true) => came.insert(key),
            (true, false) => went.insert(key),
            _ => false,
        };
    }
    for key in &went {
        users.remove(key);
    }
    let alloc = if came.is_empty() && went.is_empty() {
        last.across.alloc.clone()
    } else {
        let is_node = |n: &str| view.node(n).exists;
        Arc::new(last.across.alloc.changed(&is_node, vxlan, &came, &went, now)?)
    };
    // A class whose rows moved is stated again, as a whole compute states every class.
    let mut classes_stated = Vec::new();
    for name in came.iter().chain(&went).map(|k| &k.class).collect::<BTreeSet<_>>() {
        let (class, v) = (view.classes.get(name)?, vxlan.get(name)?);
        let rows = alloc.rows.get(name).map(|r| r.to_vec()).unwrap_or_default();
        classes_stated.push((name.clone(), class_status(view, class, v, &alloc, rows, now)));
    }

    // Linked, and their contributions moved in the nodes' digests.
    let mut ends_made = HashMap::new();
    let mut digests = last.digests.clone();
    for (was, old) in olds() {
        if let Some(c) = was.and_then(|k| k.added) {
            let (_, endpoint, nodes) = old.as_ref()?;
            for node in nodes.keys().chain([&endpoint.node]) {
                digests.get_mut(node)?.take_away(c);
            }
        }
    }
    let mut built = Vec::with_capacity(reached.len());
    for (r, placed) in reached.iter().zip(checked) {
        let cleared = placed.is_ok();
        let pm = verdicts[r.at].1;
        let verdict = placed.and_then(|p| link(view, vxlan, &alloc, p, r.linked.clone(), Some(last), &mut ends_made));
        if let Ok((p, l, route)) = &verdict {
            let c = contribution(pm, l.fingerprint, route);
            for node in p.nodes_built() {
                digests.entry(node.clone()).or_default().add(c);
            }
        }
        built.push((r.at, r.judged.clone(), cleared, verdict));
    }
    // A node that no mapping reaches and no class or Node names has no namespace.
    let seeds: BTreeSet<&String> = seeded(view).collect();
    let emptied: Vec<String> =
        digests.iter().filter(|(n, d)| d.mappings == 0 && !seeds.contains(n)).map(|(n, _)| n.clone()).collect();
    for n in &emptied {
        digests.remove(n);
    }

    // The nodes whose digest moved are rendered again: from the parts the compute before kept
    // of them, less what the reached mappings gave, with what they give now.
    let again: BTreeSet<String> =
        digests.iter().filter(|(n, d)| last.digests.get(*n) != Some(*d)).map(|(n, _)| n.clone()).collect();
    let (mut hosts, mut parts) = (last.hosts.clone(), last.parts.clone());
    hosts.retain(|n, _| digests.contains_key(n));
    parts.retain(|n, _| digests.contains_key(n));
    if !again.is_empty() {
        // A node the compute before rendered resumes from its parts; a node new to it, from none.
        let resumed = again.iter().map(|n| match last.parts.get(n) {
            Some(p) => Some((n.clone(), Some(p.clone()))),
            None => (!last.digests.contains_key(n)).then(|| (n.clone(), None)),
        });
        let mut builder = datapath::Builder::resume(resumed.collect::<Option<Vec<_>>>()?);
        for (was, old) in olds() {
            let Some(was) = was.filter(|k| k.added.is_some()) else { continue };
            let ((accepted, endpoint, nodes), Some(l)) = (old.as_ref()?, &was.linked) else { return None };
            let class = view.classes.get(&accepted.class_name)?;
            let multi = matches!(class.spec.serving_mode, crate::api::ServingMode::Multi);
            let given = datapath::Given { accepted, multi, endpoint, nodes };
            let route = view.node(&endpoint.node).route_to(endpoint.address);
            builder.take(&given, &l.ends, device(&route));
        }
        for (_, _, _, verdict) in &built {
            if let Ok((p, l, route)) = verdict {
                builder.add(p, &l.ends, device(route));
            }
        }
        // What a mapping gave is there to take, unless the parts were not made from it.
        if builder.missed() {
            return None;
        }
        for (n, (ns, p)) in builder.finish(view) {
            hosts.insert(n.clone(), Arc::new(ns));
            parts.insert(n, p);
        }
    }

    // Their statuses and outputs replace the compute before's.
    let mut kept = last.kept.clone();
    let mut statuses_made = 0;
    let (mut programming, mut tracked, mut statuses) =
        (last.made.programming.clone(), last.made.tracked.clone(), last.made.statuses.clone());
    for (key, _, _) in &gone {
        kept.remove(*key);
        programming.remove(*key);
        tracked.remove(&crate::compute::ObjectKey::port_map(&key.0, &key.1));
        statuses.remove(*key);
    }
    for (at, judged, cleared, verdict) in built {
        let (key, pm, _) = &verdicts[at];
        let s = stated(view, pm, key, (judged, cleared), verdict, Some(last), now);
        statuses_made += usize::from(s.made);
        let object = crate::compute::ObjectKey::port_map(&key.0, &key.1);
        match s.programmed {
            Some((nodes, t)) => {
                if programming.get(key) != Some(&nodes) {
                    programming.insert(key.clone(), nodes);
                }
                if tracked.get(&object) != Some(&t) {
                    tracked.insert(object, t);
                }
            }
            None => {
                programming.remove(key);
                tracked.remove(&object);
            }
        }
        // An equal entry is left in place: its path stays shared with the compute before's.
        if statuses.get(key) != Some(&s.status) {
            statuses.insert(key.clone(), s.status);
        }
        kept.insert(key.clone(), s.kept);
    }
    out.port_maps = statuses;
    out.programming = programming;
    out.tracked = tracked;
    out.classes = last.made.classes.clone();
    if !classes_stated.is_empty() {
        Arc::make_mut(&mut out.classes).extend(classes_stated);
    }
    // The ends taken from the compute before are there already.
    ends_made.retain(|at, (numbers, _)| last.ends.get(at).is_none_or(|(n, _)| n != numbers));
    let ends = if ends_made.is_empty() {
        last.ends.clone()
    } else {
        let mut ends = HashMap::clone(&last.ends);
        ends.extend(ends_made);
        Arc::new(ends)
    };
    Some(Built {
        admitted,
        readmitted: !since.admission,
        patched: true,
        hosts,
        parts,
        digests,
        ends,
        kept,
        made: super::Made::of(out),
        across: super::Across { alloc, users, pod_ports, every_pod },
        placed: placed_anew,
        statuses_made,
        rendered: again.len(),
        nodes: Arc::default(),
    })
}
