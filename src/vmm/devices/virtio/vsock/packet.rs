//! The virtio-vsock packet header (virtio 1.2, section 5.10.6): 44 bytes,
//! little-endian, in front of every packet on the receive and transmit
//! queues. Pure: parsing takes any bytes a guest wrote.

/// The header's length.
pub const HDR_LEN: usize = 44;
/// The host's context ID.
pub const HOST_CID: u64 = 2;
/// `type`: a stream socket (the only kind offered; no SEQPACKET).
pub const TYPE_STREAM: u16 = 1;
/// The largest payload a packet carries (Linux's
/// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); a longer transmit packet is refused.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// `flags` of a SHUTDOWN: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// `flags` of a SHUTDOWN: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// `op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Connect.
    Request,
    /// Connected.
    Response,
    /// Reset: the connection is gone.
    Rst,
    /// One or both directions end (`flags`).
    Shutdown,
    /// Data.
    Rw,
    /// The sender's buffer space, unasked.
    CreditUpdate,
    /// Asks for a CreditUpdate.
    CreditRequest,
}

impl Op {
    fn code(self) -> u16 {
        match self {
            Op::Request => 1,
            Op::Response => 2,
            Op::Rst => 3,
            Op::Shutdown => 4,
            Op::Rw => 5,
            Op::CreditUpdate => 6,
            Op::CreditRequest => 7,
        }
    }

    fn from_code(code: u16) -> Option<Op> {
        Some(match code {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Source context ID.
    pub src_cid: u64,
    /// Destination context ID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload bytes.
    pub len: u32,
    /// Socket type.
    pub kind: u16,
    /// What the packet is.
    pub op: Op,
    /// SHUTDOWN's flags.
    pub flags: u32,
    /// The sender's receive buffer.
    pub buf_alloc: u32,
    /// What the sender has taken from it so far.
    pub fwd_cnt: u32,
}

/// Why a transmit packet's header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Shorter than [`HDR_LEN`].
    #[error("a packet of {0} bytes is shorter than its header")]
    Short(usize),
    /// An `op` virtio does not define.
    #[error("op {0} is not a vsock operation")]
    Op(u16),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

impl Header {
    /// Parses the first [`HDR_LEN`] bytes of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Header, HeaderError> {
        let b = bytes
            .get(..HDR_LEN)
            .ok_or(HeaderError::Short(bytes.len()))?;
        let u64_at = |at: usize| u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32;
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        let code = u16_at(30);
        Ok(Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            kind: u16_at(28),
            op: Op::from_code(code).ok_or(HeaderError::Op(code))?,
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        })
    }

    /// The header's bytes.
    pub fn bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.code().to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let ops = [
            Op::Request,
            Op::Response,
            Op::Rst,
            Op::Shutdown,
            Op::Rw,
            Op::CreditUpdate,
            Op::CreditRequest,
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let h = Header {
                src_cid: 3 + i as u64,
                dst_cid: HOST_CID,
                src_port: 1024 + i as u32,
                dst_port: 52,
                len: 7,
                kind: TYPE_STREAM,
                op,
                flags: SHUTDOWN_SEND,
                buf_alloc: 65536,
                fwd_cnt: 12,
            };
            assert_eq!(Header::parse(&h.bytes()), Ok(h));
        }
        // (bytes, error)
        let mut bad_op = Header::parse(&[0u8; HDR_LEN]).map(|_| ()).unwrap_err();
        assert_eq!(bad_op, HeaderError::Op(0));
        let mut b = [0u8; HDR_LEN];
        b[30] = 8;
        bad_op = Header::parse(&b).map(|_| ()).unwrap_err();
        assert_eq!(bad_op, HeaderError::Op(8));
        assert_eq!(Header::parse(&b[..43]), Err(HeaderError::Short(43)));
    }
}
