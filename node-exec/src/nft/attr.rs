//! Netlink attributes (TLVs): a writer with nesting, and a parser.

use super::NftError;
use super::consts::{NLA_F_NESTED, NLA_TYPE_MASK};

/// Pads a length to the 4-byte netlink alignment.
pub(crate) fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends attributes to a buffer; nests are patched with their length when closed.
#[derive(Default, Debug, Clone)]
pub(crate) struct AttrWriter {
    pub(crate) buf: Vec<u8>,
}

impl AttrWriter {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn put(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        // Attribute lengths are u16; callers keep nests far below that (see encode::MAX_ELEMS_BYTES).
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// nf_tables integers are big endian.
    pub(crate) fn put_u32(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }

    /// Strings are NUL terminated.
    pub(crate) fn put_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v);
    }

    pub(crate) fn begin(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }

    pub(crate) fn end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// `ty { NFTA_DATA_VALUE: data }`, the shape of every data attribute.
    pub(crate) fn put_data(&mut self, ty: u16, data: &[u8]) {
        let at = self.begin(ty);
        self.put(super::consts::NFTA_DATA_VALUE, data);
        self.end(at);
    }
}

/// One parsed attribute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attr<'a> {
    pub(crate) ty: u16,
    pub(crate) data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub(crate) fn u32(&self) -> Result<u32, NftError> {
        let b: [u8; 4] = self.data.try_into().map_err(|_| decode_err(format!("attribute {} is not a u32", self.ty)))?;
        Ok(u32::from_be_bytes(b))
    }

    pub(crate) fn str(&self) -> Result<String, NftError> {
        let s = self.data.split(|b| *b == 0).next().unwrap_or_default();
        String::from_utf8(s.to_vec()).map_err(|_| decode_err(format!("attribute {} is not UTF-8", self.ty)))
    }

    pub(crate) fn nested(&self) -> Result<Vec<Attr<'a>>, NftError> {
        parse(self.data)
    }

    /// The value inside `{ NFTA_DATA_VALUE: bytes }`.
    pub(crate) fn data_value(&self) -> Result<Vec<u8>, NftError> {
        let inner = self.nested()?;
        find(&inner, super::consts::NFTA_DATA_VALUE)
            .map(|a| a.data.to_vec())
            .ok_or_else(|| decode_err(format!("attribute {} has no value", self.ty)))
    }
}

pub(crate) fn decode_err(what: String) -> NftError {
    NftError::Decode { what }
}

/// Parses a run of attributes.
pub(crate) fn parse(mut buf: &[u8]) -> Result<Vec<Attr<'_>>, NftError> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return Err(decode_err(format!("attribute {ty} has a bad length {len}")));
        }
        out.push(Attr { ty, data: &buf[4..len] });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

pub(crate) fn find<'a, 'b>(attrs: &'b [Attr<'a>], ty: u16) -> Option<&'b Attr<'a>> {
    attrs.iter().find(|a| a.ty == ty)
}

pub(crate) fn need<'a, 'b>(attrs: &'b [Attr<'a>], ty: u16, what: &str) -> Result<&'b Attr<'a>, NftError> {
    find(attrs, ty).ok_or_else(|| decode_err(format!("{what}: attribute {ty} missing")))
}
