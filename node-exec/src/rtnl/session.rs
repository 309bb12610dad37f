//! One rtnetlink session inside a namespace: a connection on a thread that entered it, the last
//! dump of what the kernel holds, and the writes sent so far with the kernel's refusals.
//!
//! The work is synchronous (each request blocks on the thread's own runtime), so the executor's
//! steps can call it one object at a time and in order.

use std::{future::Future, path::Path};

use rtnetlink::{Handle, sys::AsyncSocket};

use super::{
    apply::ApplyReport,
    error::{Error, Op},
    netns,
    observe::{self, Observed},
};

/// errnos that mean a removal's object is already gone.
const GONE: [i32; 3] = [libc::ENOENT, libc::ESRCH, libc::ENODEV];

/// A connection inside one namespace, usable only on the thread [`session`] runs `work` on.
pub struct Session {
    rt: tokio::runtime::Runtime,
    handle: Handle,
    /// The last dump; None until the first one, and again once a write made it stale.
    observed: Option<Observed>,
    /// What was written since the last [`Session::take`].
    report: ApplyReport,
    /// The refusals since the last [`Session::take`].
    errors: Vec<Error>,
}

/// Runs `work` with a session inside `netns` (None: the caller's namespace), on a thread of its
/// own that ends with it.
pub fn session<T, F>(netns: Option<&Path>, work: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce(&mut Session) -> T + Send,
{
    netns::run(netns, move || {
        let mut s = Session::open()?;
        Ok(work(&mut s))
    })
}

impl Session {
    fn open() -> Result<Self, Error> {
        let rt = netns::runtime()?;
        let handle = rt.block_on(async { connect() })?;
        Ok(Session { rt, handle, observed: None, report: ApplyReport::default(), errors: Vec::new() })
    }

    /// Links, addresses, routes and rules as the kernel has them (dumped again after a write
    /// that made the last dump stale). Sysctls are not part of it.
    pub(crate) fn observed(&mut self) -> Result<&Observed, Error> {
        if self.observed.is_none() {
            let handle = self.handle.clone();
            self.observed = Some(self.rt.block_on(async move { observe::dump(&handle).await })?);
        }
        self.last()
    }

    /// [`Session::observed`], handed over.
    pub(crate) fn take_observed(&mut self) -> Result<Observed, Error> {
        self.observed()?;
        self.observed
            .take()
            .ok_or_else(|| Error::Io { what: "rtnetlink session", source: std::io::Error::other("the dump vanished") })
    }

    /// Runs a request of its own on the session's runtime.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The last dump, without dumping.
    pub(crate) fn last(&self) -> Result<&Observed, Error> {
        self.observed.as_ref().ok_or_else(|| Error::Io {
            what: "rtnetlink session",
            source: std::io::Error::other("planned before observing"),
        })
    }

    /// Makes the next [`Session::observed`] dump again: new and recreated links have new
    /// indexes, and a recreated link lost its addresses and routes.
    pub(crate) fn stale(&mut self) {
        self.observed = None;
    }

    /// The index of link `dev` in the last observation; records the refusal of `object` when
    /// the link does not exist (typically because creating it failed).
    pub(crate) fn index(&mut self, object: &dyn std::fmt::Display, dev: &str) -> Option<u32> {
        let index = self.observed.as_ref().and_then(|o| o.link(dev)).map(|l| l.index);
        if index.is_none() {
            self.errors.push(Error::NoDevice { object: object.to_string(), dev: dev.to_string() });
        }
        index
    }

    /// Writes sent since the last [`Session::take`], refused ones included.
    pub(crate) fn written(&self) -> usize {
        self.report.writes
    }

    pub(crate) fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Sends one write and records it: its success, or the kernel's refusal. A removal whose
    /// object is already gone counts as done.
    pub(crate) fn write<F>(&mut self, op: Op, object: String, req: F) -> bool
    where
        F: Future<Output = Result<(), rtnetlink::Error>>,
    {
        self.report.writes += 1;
        match self.rt.block_on(req) {
            Ok(()) => {
                self.report.actions.push(format!("{op} {object}"));
                true
            }
            Err(e) => {
                let err = Error::kernel(op, &object, e);
                if op == Op::Delete && err.errno().is_some_and(|n| GONE.contains(&n)) {
                    self.report.actions.push(format!("{op} {object} (already gone)"));
                    return true;
                }
                self.errors.push(err);
                false
            }
        }
    }

    /// Records a write that is not a netlink request (a sysctl), or its failure.
    pub(crate) fn record(&mut self, result: Result<String, Error>) -> bool {
        self.report.writes += 1;
        match result {
            Ok(action) => {
                self.report.actions.push(action);
                true
            }
            Err(e) => {
                self.errors.push(e);
                false
            }
        }
    }

    /// Whether nothing was refused since the last [`Session::take`].
    pub(crate) fn clean(&self) -> bool {
        self.errors.is_empty()
    }

    /// What was written and refused since the last call.
    pub(crate) fn take(&mut self) -> (ApplyReport, Vec<Error>) {
        (std::mem::take(&mut self.report), std::mem::take(&mut self.errors))
    }
}

/// A request connection on the calling thread's namespace; must run inside a runtime.
fn connect() -> Result<Handle, Error> {
    let (mut conn, handle, _) =
        rtnetlink::new_connection().map_err(|source| Error::Io { what: "opening a netlink socket", source })?;
    let socket = conn.socket_mut().socket_ref();
    // Extended acks carry the kernel's reason text; CAP_ACK keeps the request out of the error.
    for set in [rtnetlink::sys::Socket::set_ext_ack, rtnetlink::sys::Socket::set_cap_ack] {
        set(socket, true).map_err(|source| Error::Io { what: "configuring the netlink socket", source })?;
    }
    tokio::spawn(conn);
    Ok(handle)
}
