//! kuport node executor
pub mod executor;
pub mod nft;
pub mod route;
pub mod sync;
