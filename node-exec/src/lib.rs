//! kuport node executor
pub mod nft;
pub mod route;
