//! kuport node executor
pub mod conntrack;
pub mod executor;
pub mod nft;
pub mod route;
pub mod sync;
