//! Links, addresses, neighbours, routes and policy rules of one network namespace, through
//! rtnetlink: the desired ones validated ([`Desired`], which also carries the state's sysctls),
//! the kernel's read back ([`read`]), compared per kind (`link`, `address`, `neighbour`, `route`,
//! `rule`) and written one object at a time in a [`Session`]. The executor's steps order the
//! kinds.
//!
//! kuport owns only: links named `kup-*`; addresses and permanent neighbour entries on those
//! links; routes in the tables its routes and rules name (other than main/default/local) and
//! routes on `kup-*` links (never the kernel's own `proto kernel` routes); and rules at
//! preferences 101 and 102 whose mark is under its prefix 0x6b700000/16. Nothing else is read
//! as extra or ever written.
//!
//! - [`apply`] makes a namespace match a [`kuport_proto::v1::NetnsState`] (without its nft
//!   tables), counting its writes.
//! - [`read`] and [`diff`] report drift; [`subscribe`] says when to look again.
//!
//! Addresses, neighbours, routes and rules are IPv4 or IPv6, each kind one code path for both
//! families, and ownership is the same for both (a table kuport owns is its in either family);
//! VXLAN endpoints (the underlay) are IPv4. The kernel's IPv6 link-local address on a `kup-*`
//! link is its own, never kuport's.

pub(crate) mod address;
mod apply;
pub mod consts;
mod diff;
mod error;
pub(crate) mod link;
mod model;
pub(crate) mod neighbour;
mod netns;
mod observe;
pub(crate) mod route;
pub(crate) mod rule;
mod session;
mod watch;

pub use apply::{ApplyReport, apply};
pub use diff::{Change, Difference, diff};
pub use error::{ApplyError, Error, Op};
pub use model::{AddressSpec, Desired, LinkSpec, Mac, NeighbourSpec, RouteSpec, RuleSpec, SysctlSpec, VxlanSpec};
pub use observe::{
    Observed, ObservedAddress, ObservedLink, ObservedNeighbour, ObservedRoute, ObservedRule, ObservedVxlan, addresses,
    link_counters, read,
};
pub use session::{Session, session};
pub use watch::{Notification, Subject, Subscription, subscribe};

/// One kind's plan against an observation, and the writes that carry it out (`link`,
/// `address`, `neighbour`, `route`, `rule`): what the executor's steps drive, and [`diff`] names.
pub(crate) trait KindPlan: Default + Send {
    fn new(desired: &Desired, observed: &Observed) -> Self;
    /// Desired objects that are absent or differ.
    fn missing(&self, out: &mut Vec<Difference>);
    /// kuport's objects no longer desired.
    fn extra(&self, out: &mut Vec<Difference>);
    /// Adds or changes what differs; the refusals are the session's.
    fn make(&self, s: &mut Session);
    /// Removes what is no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool;
}
