//! Netfilter, natively over nfnetlink: kuport's nf_tables tables ([`nft`]) and the conntrack
//! entries a changed DNAT map or request claim leaves on a wrong path ([`conntrack`]).

pub mod conntrack;
pub mod nfnetlink;
pub mod nft;
