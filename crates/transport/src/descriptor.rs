//! The `SMGRDMA1` descriptor that tells a receiver where to READ a slot, and
//! the `[gen][payload][gen]` framing of the slot itself (PROTOCOL.md).
//!
//! Descriptor layout, integers little-endian:
//! `0..8` magic `SMGRDMA1`, `8..16` slot_addr u64, `16..24` gen u64,
//! `24..32` slot_key i64, `32..34` port u16, `34..` listener IP as UTF-8.

use bytes::{BufMut, Bytes, BytesMut};
use iris_proto::common::RemoteTensorHandle;

/// Magic and version at the start of every descriptor.
pub const MAGIC: &[u8; 8] = b"SMGRDMA1";
/// The `transport` string of a [`RemoteTensorHandle`] carrying a descriptor.
pub const TRANSPORT_NIXL: &str = "nixl";
/// Bytes before the IP.
pub const FIXED_LEN: usize = 34;
/// Bytes of framing around a payload in a slot (two u64 generation stamps).
pub const FRAME_OVERHEAD: usize = 16;

/// Where a leased slot is and how to check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The slot's address in the sender's registered arena.
    pub slot_addr: u64,
    /// The lease's generation (never 0).
    pub gen: u64,
    /// The slot's key: the item's bootstrap room.
    pub slot_key: i64,
    /// The sender's NIXL metadata listener port.
    pub port: u16,
    /// The sender's NIXL metadata listener IP.
    pub ip: String,
}

/// Why bytes are not a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error("descriptor is {0} bytes, shorter than the {FIXED_LEN}-byte header")]
    Short(usize),
    #[error("descriptor does not start with SMGRDMA1")]
    BadMagic,
    #[error("descriptor IP is not UTF-8")]
    BadUtf8,
    #[error("descriptor generation is 0")]
    ZeroGen,
    #[error("descriptor has no listener IP")]
    EmptyIp,
    #[error("remote tensor transport is {0:?}, not \"nixl\"")]
    WrongTransport(String),
}

impl Descriptor {
    /// The wire bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(FIXED_LEN + self.ip.len());
        out.put_slice(MAGIC);
        out.put_u64_le(self.slot_addr);
        out.put_u64_le(self.gen);
        out.put_i64_le(self.slot_key);
        out.put_u16_le(self.port);
        out.put_slice(self.ip.as_bytes());
        out.freeze()
    }

    /// Parses wire bytes.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor, DescriptorError> {
        if bytes.len() < FIXED_LEN {
            return Err(DescriptorError::Short(bytes.len()));
        }
        if &bytes[0..8] != MAGIC {
            return Err(DescriptorError::BadMagic);
        }
        let gen = le_u64(&bytes[16..24]);
        if gen == 0 {
            return Err(DescriptorError::ZeroGen);
        }
        let ip = std::str::from_utf8(&bytes[FIXED_LEN..]).map_err(|_| DescriptorError::BadUtf8)?;
        if ip.is_empty() {
            return Err(DescriptorError::EmptyIp);
        }
        Ok(Descriptor {
            slot_addr: le_u64(&bytes[8..16]),
            gen,
            slot_key: le_u64(&bytes[24..32]) as i64,
            port: u16::from_le_bytes([bytes[32], bytes[33]]),
            ip: ip.to_owned(),
        })
    }

    /// The handle that carries this descriptor for a payload of `nbytes`.
    pub fn to_handle(&self, nbytes: u64) -> RemoteTensorHandle {
        RemoteTensorHandle {
            transport: TRANSPORT_NIXL.to_owned(),
            descriptor: self.encode(),
            nbytes,
        }
    }

    /// Parses the descriptor of a `"nixl"` handle.
    pub fn from_handle(handle: &RemoteTensorHandle) -> Result<Descriptor, DescriptorError> {
        if handle.transport != TRANSPORT_NIXL {
            return Err(DescriptorError::WrongTransport(handle.transport.clone()));
        }
        Descriptor::decode(&handle.descriptor)
    }

    /// The notification text the receiver sends after its READ.
    pub fn notification(&self) -> String {
        self.slot_key.to_string()
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Why a READ slot image is not the expected lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("slot image is {actual} bytes, expected {expected}")]
    Length { expected: usize, actual: usize },
    #[error("slot generation stamps are {head}/{tail}, expected {expected} (slot reused or torn)")]
    Generation { expected: u64, head: u64, tail: u64 },
}

/// Writes `[gen][payload][gen]` at the start of `slot`; returns bytes used.
/// The caller guarantees `slot.len() >= payload.len() + FRAME_OVERHEAD`.
pub fn write_frame(slot: &mut [u8], gen: u64, payload: &[u8]) -> usize {
    let end = payload.len() + 8;
    slot[..8].copy_from_slice(&gen.to_le_bytes());
    slot[8..end].copy_from_slice(payload);
    slot[end..end + 8].copy_from_slice(&gen.to_le_bytes());
    end + 8
}

/// Checks both stamps of a frame of `nbytes` payload; returns the payload.
pub fn check_frame(image: &[u8], gen: u64, nbytes: usize) -> Result<&[u8], FrameError> {
    let expected = nbytes + FRAME_OVERHEAD;
    if image.len() != expected {
        return Err(FrameError::Length {
            expected,
            actual: image.len(),
        });
    }
    let head = le_u64(&image[..8]);
    let tail = le_u64(&image[expected - 8..]);
    if head != gen || tail != gen {
        return Err(FrameError::Generation {
            expected: gen,
            head,
            tail,
        });
    }
    Ok(&image[8..expected - 8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Descriptor {
        Descriptor {
            slot_addr: 0x0000_7f00_1234_5000,
            gen: 7,
            slot_key: -2,
            port: 5555,
            ip: "10.0.0.1".into(),
        }
    }

    #[test]
    fn golden_bytes() {
        let mut want = Vec::new();
        want.extend_from_slice(b"SMGRDMA1");
        want.extend_from_slice(&[0x00, 0x50, 0x34, 0x12, 0x00, 0x7f, 0x00, 0x00]);
        want.extend_from_slice(&[7, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        want.extend_from_slice(&[0xb3, 0x15]);
        want.extend_from_slice(b"10.0.0.1");
        assert_eq!(sample().encode().as_ref(), want.as_slice());
        assert_eq!(Descriptor::decode(&want), Ok(sample()));
    }

    #[test]
    fn round_trip_extremes() {
        let d = Descriptor {
            slot_addr: u64::MAX,
            gen: u64::MAX,
            slot_key: i64::MAX,
            port: u16::MAX,
            ip: "fe80::1%eth0".into(),
        };
        assert_eq!(Descriptor::decode(&d.encode()), Ok(d.clone()));
        let h = d.to_handle(42);
        assert_eq!(h.transport, "nixl");
        assert_eq!(h.nbytes, 42);
        assert_eq!(Descriptor::from_handle(&h), Ok(d));
    }

    #[test]
    fn typed_decode_errors() {
        let good = sample().encode();
        assert_eq!(
            Descriptor::decode(&good[..33]),
            Err(DescriptorError::Short(33))
        );
        let mut bad = good.to_vec();
        bad[7] = b'2';
        assert_eq!(Descriptor::decode(&bad), Err(DescriptorError::BadMagic));
        let mut bad = good.to_vec();
        bad.push(0xff);
        assert_eq!(Descriptor::decode(&bad), Err(DescriptorError::BadUtf8));
        let mut bad = good.to_vec();
        bad[16..24].fill(0);
        assert_eq!(Descriptor::decode(&bad), Err(DescriptorError::ZeroGen));
        assert_eq!(
            Descriptor::decode(&good[..34]),
            Err(DescriptorError::EmptyIp)
        );
        let mut h = sample().to_handle(1);
        h.transport = "mooncake".into();
        assert!(matches!(
            Descriptor::from_handle(&h),
            Err(DescriptorError::WrongTransport(_))
        ));
    }

    #[test]
    fn notification_is_decimal_key() {
        assert_eq!(sample().notification(), "-2");
    }

    #[test]
    fn framing_round_trip_and_checks() {
        let mut slot = vec![0u8; 64];
        let used = write_frame(&mut slot, 9, b"hello");
        assert_eq!(used, 21);
        assert_eq!(&slot[..8], &9u64.to_le_bytes());
        assert_eq!(&slot[13..21], &9u64.to_le_bytes());
        assert_eq!(check_frame(&slot[..21], 9, 5), Ok(&b"hello"[..]));
        assert!(matches!(
            check_frame(&slot[..21], 8, 5),
            Err(FrameError::Generation {
                head: 9,
                tail: 9,
                ..
            })
        ));
        assert!(matches!(
            check_frame(&slot[..20], 9, 5),
            Err(FrameError::Length { .. })
        ));
        // A torn frame: head from one lease, tail from another.
        slot[13..21].copy_from_slice(&10u64.to_le_bytes());
        assert!(matches!(
            check_frame(&slot[..21], 9, 5),
            Err(FrameError::Generation {
                head: 9,
                tail: 10,
                ..
            })
        ));
    }
}
