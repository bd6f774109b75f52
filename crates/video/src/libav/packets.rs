//! Demuxing the video stream's packets into memory, and the table of their
//! timestamps that lets decoding start at a keyframe.

use ffmpeg_next::format::context::Input;
use ffmpeg_next::{ffi, Error, Packet};

use crate::container::Container;
use crate::error::VideoError;

/// Consecutive "try again" answers from the demuxer before giving up
/// (reading from memory never blocks, so this is only a hang guard).
const MAX_RETRIES: u32 = 64;

/// Every packet of stream `index`, in decode order. An error other than
/// the end of the data is `Corrupt`, as PyAV raises it.
pub(crate) fn read(
    input: &mut Input,
    index: usize,
    container: Container,
) -> Result<Vec<Packet>, VideoError> {
    let mut packets = Vec::new();
    demux(input, index, container, |packet| packets.push(packet))?;
    Ok(packets)
}

/// The number of packets of stream `index` (demuxing only, none kept).
pub(crate) fn count(
    input: &mut Input,
    index: usize,
    container: Container,
) -> Result<u64, VideoError> {
    let mut count = 0;
    demux(input, index, container, |_| count += 1)?;
    Ok(count)
}

/// Hands every packet of stream `index` to `each`, in decode order.
fn demux(
    input: &mut Input,
    index: usize,
    container: Container,
    mut each: impl FnMut(Packet),
) -> Result<(), VideoError> {
    let mut retries = 0;
    loop {
        let mut packet = Packet::empty();
        match packet.read(input) {
            Ok(()) => {
                retries = 0;
                if packet.stream() == index {
                    each(packet);
                }
            }
            Err(Error::Eof) => return Ok(()),
            Err(Error::Other { errno }) if errno == ffi::EAGAIN && retries < MAX_RETRIES => {
                retries += 1;
            }
            Err(err) => {
                return Err(VideoError::Corrupt {
                    container,
                    stage: "demuxing packets",
                    message: err.to_string(),
                })
            }
        }
    }
}

/// Where each frame's packet sits, for streams whose packets map one to
/// one onto frames: every packet has a distinct presentation timestamp and
/// none is marked discarded or corrupt. Frame `i` in display order is then
/// the packet with the i-th smallest timestamp.
pub(crate) struct SeekTable {
    /// Presentation timestamps in display order.
    sorted_pts: Vec<i64>,
    /// Decode-order positions of the keyframe packets, with their pts.
    keyframes: Vec<(usize, i64)>,
}

impl SeekTable {
    /// The table, or `None` when the packets do not map onto frames
    /// plainly (then only decoding from the start is exact).
    pub(crate) fn new(packets: &[Packet], total_frames: u64) -> Option<Self> {
        if packets.len() as u64 != total_frames || !packets.first()?.is_key() {
            return None;
        }
        let discard = ffi::AV_PKT_FLAG_DISCARD | ffi::AV_PKT_FLAG_CORRUPT;
        let mut sorted_pts = Vec::with_capacity(packets.len());
        let mut keyframes = Vec::new();
        for (pos, packet) in packets.iter().enumerate() {
            let pts = packet.pts()?;
            if packet.flags().bits() & discard != 0 {
                return None;
            }
            if packet.is_key() {
                keyframes.push((pos, pts));
            }
            sorted_pts.push(pts);
        }
        sorted_pts.sort_unstable();
        if sorted_pts.windows(2).any(|w| w[0] == w[1]) {
            return None;
        }
        Some(SeekTable {
            sorted_pts,
            keyframes,
        })
    }

    /// The display index of the frame with timestamp `pts`.
    pub(crate) fn index_of(&self, pts: i64) -> Option<u64> {
        self.sorted_pts.binary_search(&pts).ok().map(|i| i as u64)
    }

    /// The last keyframe in decode order shown at or before frame `index`:
    /// its decode position and timestamp.
    pub(crate) fn keyframe_before(&self, index: u64) -> Option<(usize, i64)> {
        let target = *self.sorted_pts.get(usize::try_from(index).ok()?)?;
        self.keyframes
            .iter()
            .rev()
            .find(|&&(_, pts)| pts <= target)
            .copied()
    }
}
