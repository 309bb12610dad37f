//! nf_tables' reading of netlink attributes: integers are big endian, data sits in
//! `{ NFTA_DATA_VALUE: bytes }`, and a malformed attribute is a decode error. The TLV codec
//! itself is [`crate::sys::netlink::attr`].

use super::NftError;
use super::consts::NFTA_DATA_VALUE;
use crate::sys::netlink::attr::{self as tlv, Malformed};
pub(crate) use crate::sys::netlink::attr::{Attr, AttrWriter, find};

impl From<Malformed> for NftError {
    fn from(e: Malformed) -> Self {
        decode_err(e.to_string())
    }
}

/// Writing nf_tables values.
pub(crate) trait WriteNft {
    /// nf_tables integers are big endian.
    fn put_u32(&mut self, ty: u16, v: u32);
    /// `ty { NFTA_DATA_VALUE: data }`, the shape of every data attribute.
    fn put_data(&mut self, ty: u16, data: &[u8]);
}

impl WriteNft for AttrWriter {
    fn put_u32(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }

    fn put_data(&mut self, ty: u16, data: &[u8]) {
        let at = self.begin(ty);
        self.put(NFTA_DATA_VALUE, data);
        self.end(at);
    }
}

/// Reading nf_tables values.
pub(crate) trait ReadNft<'a> {
    fn u32(&self) -> Result<u32, NftError>;
    fn str(&self) -> Result<String, NftError>;
    fn nested(&self) -> Result<Vec<Attr<'a>>, NftError>;
    /// The value inside `{ NFTA_DATA_VALUE: bytes }`.
    fn data_value(&self) -> Result<Vec<u8>, NftError>;
}

impl<'a> ReadNft<'a> for Attr<'a> {
    fn u32(&self) -> Result<u32, NftError> {
        let b: [u8; 4] = self.data.try_into().map_err(|_| decode_err(format!("attribute {} is not a u32", self.ty)))?;
        Ok(u32::from_be_bytes(b))
    }

    fn str(&self) -> Result<String, NftError> {
        let s = self.data.split(|b| *b == 0).next().unwrap_or_default();
        String::from_utf8(s.to_vec()).map_err(|_| decode_err(format!("attribute {} is not UTF-8", self.ty)))
    }

    fn nested(&self) -> Result<Vec<Attr<'a>>, NftError> {
        parse(self.data)
    }

    fn data_value(&self) -> Result<Vec<u8>, NftError> {
        let inner = self.nested()?;
        find(&inner, NFTA_DATA_VALUE)
            .map(|a| a.data.to_vec())
            .ok_or_else(|| decode_err(format!("attribute {} has no value", self.ty)))
    }
}

pub(crate) fn decode_err(what: String) -> NftError {
    NftError::Decode { what }
}

/// Parses a run of attributes.
pub(crate) fn parse(buf: &[u8]) -> Result<Vec<Attr<'_>>, NftError> {
    Ok(tlv::parse(buf)?)
}

pub(crate) fn need<'a, 'b>(attrs: &'b [Attr<'a>], ty: u16, what: &str) -> Result<&'b Attr<'a>, NftError> {
    find(attrs, ty).ok_or_else(|| decode_err(format!("{what}: attribute {ty} missing")))
}
