//! Netlink attributes (TLVs): a writer with nesting, and a parser. Values are bytes: each
//! family says its own byte order (nf_tables: big endian).

use super::consts::{NLA_F_NESTED, NLA_TYPE_MASK};

/// Pads a length to the 4-byte netlink alignment.
pub fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends attributes to a buffer; nests are patched with their length when closed.
#[derive(Default, Debug, Clone)]
pub struct AttrWriter {
    pub buf: Vec<u8>,
}

impl AttrWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        // Attribute lengths are u16; callers keep nests far below that.
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// Strings are NUL terminated.
    pub fn put_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v);
    }

    /// Opens a nested attribute; returns where it starts, for [`AttrWriter::end`].
    pub fn begin(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }

    pub fn end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// One parsed attribute (its type without the nested/byte-order bits).
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    pub ty: u16,
    pub data: &'a [u8],
}

/// An attribute whose length does not fit its buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attribute {ty} has a bad length {len}")]
pub struct Malformed {
    pub ty: u16,
    pub len: usize,
}

/// Parses a run of attributes.
pub fn parse(mut buf: &[u8]) -> Result<Vec<Attr<'_>>, Malformed> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return Err(Malformed { ty, len });
        }
        out.push(Attr { ty, data: &buf[4..len] });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

pub fn find<'a, 'b>(attrs: &'b [Attr<'a>], ty: u16) -> Option<&'b Attr<'a>> {
    attrs.iter().find(|a| a.ty == ty)
}
