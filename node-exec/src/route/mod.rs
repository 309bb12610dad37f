//! Links, addresses, routes, policy rules and sysctls of one network namespace, through rtnetlink.
//!
//! kuport owns only: links named `kup-*`; addresses on those links; routes in the tables its
//! routes and rules name (other than main/default/local) and routes on `kup-*` links (never the
//! kernel's own `proto kernel` routes); and rules at preferences 101 and 102 whose mark is under
//! its prefix 0x6b700000/16. Nothing else is read as extra or ever written.
//!
//! - [`apply`] makes a namespace match a [`kuport_proto::v1::NetnsState`], counting its writes.
//! - [`read`] and [`diff`] report drift; [`subscribe`] says when to look again.
//!
//! IPv4 only: the desired state's addresses, routes and rules are IPv4 and are parsed as such.

mod apply;
pub mod consts;
mod diff;
mod error;
mod model;
mod netns;
mod observe;
mod sysctl;
mod watch;

pub use apply::{ApplyReport, apply, apply_desired};
pub use diff::{Change, Difference, diff};
pub use error::{ApplyError, Error, Op};
pub use model::{AddressSpec, Desired, LinkSpec, RouteSpec, RuleSpec, SysctlSpec, VxlanSpec};
pub use observe::{Observed, ObservedAddress, ObservedLink, ObservedRoute, ObservedRule, ObservedVxlan, read};
pub use watch::{Notification, Subject, Subscription, subscribe};
