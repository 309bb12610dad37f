//! Netlink messages: building one (header, the family's fixed header, attributes), splitting a
//! datagram into messages, and reading the kernel's acks and errors.

use std::io;

use super::attr::{align4, find, parse};
use super::consts::{NLM_F_ACK_TLVS, NLM_F_CAPPED, NLMSG_HDRLEN, NLMSGERR_ATTR_MSG};

/// The fields of a message header that answers are matched by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
}

/// Appends one message: nlmsghdr (port id 0: the kernel), the family's fixed header (nfgenmsg,
/// genlmsghdr), then its attributes; padded to 4 bytes.
pub fn put(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family_header: &[u8], attrs: &[u8]) {
    let len = (NLMSG_HDRLEN + family_header.len() + attrs.len()) as u32;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(family_header);
    buf.extend_from_slice(attrs);
    buf.resize(align4(buf.len()), 0);
}

/// The messages of a datagram as (header, payload after nlmsghdr); stops at anything malformed.
pub fn split(mut buf: &[u8]) -> impl Iterator<Item = (Header, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let hdr = Header {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
        };
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((hdr, payload))
    })
}

/// An NLMSG_ERROR: the kernel's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The errno (positive); 0 for an ack.
    pub errno: i32,
    /// The sequence number of the request it answers.
    pub seq: u32,
    /// The kernel's extended-ack text, when it gave one.
    pub message: Option<String>,
}

impl Ack {
    /// Parses the payload of an NLMSG_ERROR (`hdr` is its header); None when it is too short.
    pub fn parse(hdr: &Header, payload: &[u8]) -> Option<Ack> {
        let err = i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?);
        let request = payload.get(4..4 + NLMSG_HDRLEN)?;
        let seq = u32::from_ne_bytes(request.get(8..12)?.try_into().ok()?);
        let mut message = None;
        if hdr.flags & NLM_F_ACK_TLVS != 0 {
            // The request follows the errno, cut to its header with NETLINK_CAP_ACK; then the TLVs.
            let echoed = if hdr.flags & NLM_F_CAPPED != 0 {
                NLMSG_HDRLEN
            } else {
                align4(u32::from_ne_bytes(request.get(..4)?.try_into().ok()?) as usize)
            };
            let tlvs = payload.get(4 + echoed..).unwrap_or_default();
            message = parse(tlvs).ok().and_then(|attrs| {
                find(&attrs, NLMSGERR_ATTR_MSG)
                    .map(|a| String::from_utf8_lossy(a.data.split(|b| *b == 0).next().unwrap_or_default()).into_owned())
            });
        }
        Some(Ack { errno: -err, seq, message })
    }
}

/// The kernel's reason for a refusal: the errno's text, and its extended-ack text when it gave one.
pub fn reason(errno: i32, message: Option<&str>) -> String {
    let base = io::Error::from_raw_os_error(errno).to_string();
    match message {
        Some(t) if !t.is_empty() => format!("{base} ({t})"),
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::super::attr::AttrWriter;
    use super::super::consts::NLMSG_ERROR;
    use super::*;

    fn error_message(errno: i32, flags: u16, request: &[u8], text: Option<&str>) -> Vec<u8> {
        let mut payload = (-errno).to_ne_bytes().to_vec();
        payload.extend_from_slice(request);
        if let Some(t) = text {
            let mut w = AttrWriter::new();
            w.put_str(NLMSGERR_ATTR_MSG, t);
            payload.extend_from_slice(&w.buf);
        }
        let mut buf = Vec::new();
        put(&mut buf, NLMSG_ERROR, flags, 9, &[], &payload);
        buf
    }

    #[test]
    fn acks_name_the_request_and_carry_the_kernel_text() {
        let mut request = Vec::new();
        put(&mut request, 0x0a01, 0x5, 42, &[0, 0, 0, 0], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let capped = error_message(2, NLM_F_CAPPED | NLM_F_ACK_TLVS, &request[..NLMSG_HDRLEN], Some("no such set"));
        let whole = error_message(2, NLM_F_ACK_TLVS, &request, Some("no such set"));
        let plain = error_message(0, NLM_F_CAPPED, &request[..NLMSG_HDRLEN], None);
        let mut datagram = [capped, whole, plain].concat();
        datagram.extend_from_slice(&[0xff; 7]);
        let acks: Vec<Ack> = split(&datagram).filter_map(|(h, p)| Ack::parse(&h, p)).collect();
        let refused = Ack { errno: 2, seq: 42, message: Some("no such set".into()) };
        assert_eq!(acks, vec![refused.clone(), refused, Ack { errno: 0, seq: 42, message: None }]);
        assert_eq!(reason(2, Some("no such set")), "No such file or directory (os error 2) (no such set)");
    }
}
