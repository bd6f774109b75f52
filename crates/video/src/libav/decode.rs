//! Decoding the demuxed packets and keeping the wanted frames: from the
//! start (the reference order, as PyAV's `container.decode(video=0)`), or
//! jumping to the keyframe before each wanted frame when the packets allow
//! it (and then not decoding unwanted frames that nothing references), with
//! a fall back to the start whenever the jump path meets anything
//! unexpected.

use ffmpeg_next::codec::threading::{Config, Type};
use ffmpeg_next::codec::{self, decoder};
use ffmpeg_next::util::frame::video::Video;
use ffmpeg_next::{ffi, Discard, Error, Packet};

use crate::error::VideoError;
use crate::frames::Frames;
use crate::libav::packets::SeekTable;
use crate::libav::rgb::RgbConverter;
use crate::libav::stream::VideoStream;
use crate::limits::DecodeOptions;

/// The frames at `wanted` (ascending, unique, all below the frame count).
pub(crate) fn frames(
    stream: &VideoStream,
    packets: &[Packet],
    wanted: &[u64],
    opts: &DecodeOptions,
) -> Result<Frames, VideoError> {
    if opts.seek {
        if let Some(table) = SeekTable::new(packets, packets.len() as u64) {
            if let Ok(Some(frames)) = jumping(stream, packets, wanted, opts, &table) {
                return Ok(frames);
            }
        }
    }
    sequential(stream, packets, wanted, opts)
}

/// Collects the wanted frames as the decoder yields them.
struct Sink<'w> {
    wanted: &'w [u64],
    frames: Frames,
    rgb: RgbConverter,
    scratch: Vec<u8>,
}

/// What offering one decoded frame to the sink found.
enum Offer {
    Kept,
    Skipped,
    /// The frame is past the next wanted one, which was never seen.
    Missed,
}

impl<'w> Sink<'w> {
    fn new(stream: &VideoStream, wanted: &'w [u64]) -> Self {
        Sink {
            wanted,
            frames: Frames::with_capacity(stream.width, stream.height, wanted.len()),
            rgb: RgbConverter::new(),
            scratch: Vec::new(),
        }
    }

    fn next(&self) -> Option<u64> {
        self.wanted.get(self.frames.count).copied()
    }

    fn done(&self) -> bool {
        self.next().is_none()
    }

    /// Whether frame `index` is still to be kept.
    fn wants(&self, index: u64) -> bool {
        self.wanted[self.frames.count.min(self.wanted.len())..]
            .binary_search(&index)
            .is_ok()
    }

    /// Keeps `frame`, shown as frame `index`, if it is the next wanted one.
    fn offer(
        &mut self,
        stream: &VideoStream,
        index: u64,
        frame: &Video,
    ) -> Result<Offer, VideoError> {
        let Some(next) = self.next() else {
            return Ok(Offer::Skipped);
        };
        if index < next {
            return Ok(Offer::Skipped);
        }
        if index > next {
            return Ok(Offer::Missed);
        }
        if (frame.width(), frame.height()) != (stream.width, stream.height) {
            return Err(VideoError::SizeChanged {
                index,
                width: frame.width(),
                height: frame.height(),
                expected_width: stream.width,
                expected_height: stream.height,
            });
        }
        self.scratch.clear();
        self.rgb.convert(frame, &mut self.scratch)?;
        let time = frame.pts().map_or(f64::NAN, |pts| stream.seconds(pts));
        self.frames.push(&self.scratch, time);
        Ok(Offer::Kept)
    }
}

/// A decoder for the stream with `opts.threads` frame threads, refusing
/// pictures over `opts.limits.max_pixels` itself (a bitstream may declare
/// a larger size than its container).
fn open_decoder(stream: &VideoStream, opts: &DecodeOptions) -> Result<decoder::Video, VideoError> {
    let threads = opts.threads.max(1);
    let unsupported = |_| VideoError::UnsupportedCodec {
        container: stream.container,
        codec: stream.codec_name.clone(),
    };
    let mut context =
        codec::context::Context::from_parameters(stream.parameters.clone()).map_err(unsupported)?;
    if threads > 1 {
        context.set_threading(Config {
            kind: Type::Frame,
            count: threads,
            ..Config::default()
        });
    }
    let max_pixels = i64::try_from(opts.limits.max_pixels).unwrap_or(i64::MAX);
    // SAFETY: the context is valid and not yet opened; max_pixels is a
    // plain field that avcodec_open2 and the frame allocator read.
    unsafe { (*context.as_mut_ptr()).max_pixels = max_pixels };
    context.decoder().video().map_err(unsupported)
}

/// A decoding error as PyAV raises it.
fn decode_error(stream: &VideoStream, err: Error) -> VideoError {
    VideoError::Corrupt {
        container: stream.container,
        stage: "decoding frames",
        message: err.to_string(),
    }
}

/// The decoder's next frame into `frame`: `Ok(false)` when it needs more
/// input or is drained, an error as PyAV raises it otherwise (with frame
/// threads, decoding errors surface here rather than when sending).
fn receive(
    decoder: &mut decoder::Video,
    frame: &mut Video,
    stream: &VideoStream,
) -> Result<bool, VideoError> {
    match decoder.receive_frame(frame) {
        Ok(()) => Ok(true),
        Err(Error::Eof) => Ok(false),
        Err(Error::Other { errno }) if errno == ffi::EAGAIN => Ok(false),
        Err(err) => Err(decode_error(stream, err)),
    }
}

/// Decodes every packet from the first until the last wanted frame is out;
/// frame `i` is the i-th frame the decoder yields.
fn sequential(
    stream: &VideoStream,
    packets: &[Packet],
    wanted: &[u64],
    opts: &DecodeOptions,
) -> Result<Frames, VideoError> {
    let mut decoder = open_decoder(stream, opts)?;
    let mut sink = Sink::new(stream, wanted);
    let mut index = 0u64;
    let mut frame = Video::empty();
    let mut drain = |decoder: &mut decoder::Video, sink: &mut Sink, index: &mut u64| {
        while receive(decoder, &mut frame, stream)? {
            sink.offer(stream, *index, &frame)?;
            *index += 1;
            if sink.done() {
                break;
            }
        }
        Ok::<(), VideoError>(())
    };
    for packet in packets {
        decoder
            .send_packet(packet)
            .map_err(|e| decode_error(stream, e))?;
        drain(&mut decoder, &mut sink, &mut index)?;
        if sink.done() {
            return Ok(sink.frames);
        }
    }
    decoder.send_eof().map_err(|e| decode_error(stream, e))?;
    drain(&mut decoder, &mut sink, &mut index)?;
    match sink.next() {
        None => Ok(sink.frames),
        Some(missing) => Err(VideoError::IndexOutOfRange {
            index: missing,
            total_frames: index,
        }),
    }
}

/// Decodes from the keyframe before each wanted frame, skipping the GOPs
/// in between. `Ok(None)` when a frame came out that the table does not
/// explain (then the caller decodes from the start).
fn jumping(
    stream: &VideoStream,
    packets: &[Packet],
    wanted: &[u64],
    opts: &DecodeOptions,
    table: &SeekTable,
) -> Result<Option<Frames>, VideoError> {
    let mut decoder = open_decoder(stream, opts)?;
    let mut sink = Sink::new(stream, wanted);
    let mut frame = Video::empty();
    let mut pos = 0usize;
    // Frames shown before the keyframe decoding started from are leading
    // pictures that may reference skipped ones: never kept.
    let mut min_pts = i64::MIN;
    while let Some(next) = sink.next() {
        let Some((key_pos, key_pts)) = table.keyframe_before(next) else {
            return Ok(None);
        };
        if key_pos > pos {
            decoder.flush();
            pos = key_pos;
            min_pts = key_pts;
        }
        let target_count = sink.frames.count + 1;
        while sink.frames.count < target_count {
            if let Some(packet) = packets.get(pos) {
                // An unwanted frame that no other frame references need not
                // be decoded (the decoder then outputs nothing for it).
                let wanted = packet
                    .pts()
                    .and_then(|pts| table.index_of(pts))
                    .is_some_and(|index| sink.wants(index));
                decoder.skip_frame(if wanted {
                    Discard::Default
                } else {
                    Discard::NonReference
                });
                decoder
                    .send_packet(packet)
                    .map_err(|e| decode_error(stream, e))?;
                pos += 1;
            } else if pos == packets.len() {
                decoder.send_eof().map_err(|e| decode_error(stream, e))?;
                pos += 1;
            } else {
                return Ok(None);
            }
            while receive(&mut decoder, &mut frame, stream)? {
                let Some(pts) = frame.pts() else {
                    return Ok(None);
                };
                if pts < min_pts {
                    continue;
                }
                let Some(index) = table.index_of(pts) else {
                    return Ok(None);
                };
                if let Offer::Missed = sink.offer(stream, index, &frame)? {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(sink.frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{sniff, Container};
    use crate::libav::memory_input::MemoryInput;
    use crate::libav::packets;

    fn clip(name: &str) -> Vec<u8> {
        crate::libav::init_libav();
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).unwrap()
    }

    /// The clips with several GOPs take the jumping path for their last
    /// frame, starting past the first packet, and need no fall back.
    #[test]
    fn clips_with_several_gops_skip_to_a_later_keyframe() {
        for name in ["h264_bframes.mp4", "hevc.mkv", "vp9.webm", "av1.mp4"] {
            let bytes = clip(name);
            let container: Container = sniff(&bytes).unwrap();
            let mut input = MemoryInput::open(&bytes, container).unwrap();
            let stream = VideoStream::first(input.input(), container).unwrap();
            let packets = packets::read(input.input(), stream.index, container).unwrap();
            let last = packets.len() as u64 - 1;
            let table = SeekTable::new(&packets, packets.len() as u64).unwrap();
            let (key_pos, _) = table.keyframe_before(last).unwrap();
            assert!(key_pos > 0, "{name}: no later keyframe");
            let frames = jumping(
                &stream,
                &packets,
                &[2, last],
                &DecodeOptions::default(),
                &table,
            )
            .unwrap();
            assert_eq!(frames.map(|f| f.count), Some(2), "{name}: fell back");
        }
    }

    /// One GOP: nothing to skip, and the jumping path still serves it.
    #[test]
    fn a_single_gop_decodes_forward_without_jumping() {
        let bytes = clip("h264_longgop.mp4");
        let mut input = MemoryInput::open(&bytes, Container::Mp4).unwrap();
        let stream = VideoStream::first(input.input(), Container::Mp4).unwrap();
        let packets = packets::read(input.input(), stream.index, Container::Mp4).unwrap();
        let table = SeekTable::new(&packets, packets.len() as u64).unwrap();
        assert_eq!(table.keyframe_before(29).map(|k| k.0), Some(0));
        let frames = jumping(&stream, &packets, &[29], &DecodeOptions::default(), &table).unwrap();
        assert_eq!(frames.map(|f| f.count), Some(1));
    }
}
