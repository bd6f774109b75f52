//! Animated GIF and WebP as videos: the frame count and delays come from
//! the headers (`gif` without LZW decoding, `image-webp` chunk parsing),
//! the frames from the `image` crate (GIF, composited on the canvas) and
//! `image-webp` (WebP, composited), with the alpha channel dropped as
//! `frame.convert("RGB")` and PyAV's `rgb24` do.

use std::io::Cursor;

use image::AnimationDecoder;

use crate::container::Container;
use crate::error::VideoError;
use crate::frames::Frames;
use crate::info::{duration_of, VideoInfo};
use crate::limits::VideoLimits;

/// A GIF delay below this many centiseconds counts as [`GIF_DEFAULT_DELAY_CS`],
/// as FFmpeg's GIF demuxer (PyAV's reference) treats it.
const GIF_MIN_DELAY_CS: u16 = 2;
const GIF_DEFAULT_DELAY_CS: u16 = 10;
/// The delay given to a still (not animated) WebP, in milliseconds.
const STILL_DELAY_MS: u32 = 100;

/// Header facts of an animation: canvas size and each frame's delay.
struct Animation {
    container: Container,
    width: u32,
    height: u32,
    delays_ms: Vec<u32>,
}

impl Animation {
    fn read(bytes: &[u8], container: Container) -> Result<Self, VideoError> {
        match container {
            Container::Gif => read_gif_header(bytes),
            Container::WebP => read_webp_header(bytes),
            Container::Mp4 | Container::Matroska => Err(VideoError::UnsupportedContainer),
        }
    }

    fn info(&self) -> VideoInfo {
        let total_ms: u64 = self.delays_ms.iter().map(|&d| u64::from(d)).sum();
        let frames = self.delays_ms.len() as u64;
        let fps = if total_ms > 0 {
            frames as f64 * 1000.0 / total_ms as f64
        } else {
            0.0
        };
        VideoInfo {
            container: self.container,
            codec: match self.container {
                Container::WebP => "webp",
                _ => "gif",
            }
            .to_string(),
            width: self.width,
            height: self.height,
            fps,
            total_frames: frames,
            duration_secs: duration_of(frames, fps),
        }
    }
}

fn corrupt(container: Container, stage: &'static str, err: impl ToString) -> VideoError {
    VideoError::Corrupt {
        container,
        stage,
        message: err.to_string(),
    }
}

fn read_gif_header(bytes: &[u8]) -> Result<Animation, VideoError> {
    let bad = |e: gif::DecodingError| corrupt(Container::Gif, "reading the GIF frames", e);
    let mut options = gif::DecodeOptions::new();
    options.set_color_output(gif::ColorOutput::Indexed);
    options.skip_frame_decoding(true);
    let mut decoder = options.read_info(Cursor::new(bytes)).map_err(bad)?;
    let (width, height) = (u32::from(decoder.width()), u32::from(decoder.height()));
    let mut delays_ms = Vec::new();
    while let Some(frame) = decoder.read_next_frame().map_err(bad)? {
        let cs = if frame.delay < GIF_MIN_DELAY_CS {
            GIF_DEFAULT_DELAY_CS
        } else {
            frame.delay
        };
        delays_ms.push(u32::from(cs) * 10);
    }
    Ok(Animation {
        container: Container::Gif,
        width,
        height,
        delays_ms,
    })
}

fn webp_decoder(bytes: &[u8]) -> Result<image_webp::WebPDecoder<Cursor<&[u8]>>, VideoError> {
    image_webp::WebPDecoder::new(Cursor::new(bytes))
        .map_err(|e| corrupt(Container::WebP, "reading the WebP header", e))
}

fn read_webp_header(bytes: &[u8]) -> Result<Animation, VideoError> {
    let decoder = webp_decoder(bytes)?;
    let (width, height) = decoder.dimensions();
    let delays_ms = if decoder.is_animated() {
        // Per-frame delays are only known when the frames are read; spread
        // the loop duration evenly for the header facts.
        let n = decoder.num_frames();
        let total = decoder.loop_duration();
        let each = if n > 0 { total / u64::from(n) } else { 0 };
        vec![u32::try_from(each).unwrap_or(u32::MAX); n as usize]
    } else {
        vec![STILL_DELAY_MS]
    };
    Ok(Animation {
        container: Container::WebP,
        width,
        height,
        delays_ms,
    })
}

/// Probes an animated GIF or WebP.
pub(crate) fn probe(bytes: &[u8], container: Container) -> Result<VideoInfo, VideoError> {
    Ok(Animation::read(bytes, container)?.info())
}

/// Decodes the frames at `wanted` (ascending, unique) after checking the
/// header against `limits`.
pub(crate) fn decode(
    bytes: &[u8],
    container: Container,
    wanted: &[u64],
    limits: &VideoLimits,
) -> Result<(VideoInfo, Frames), VideoError> {
    let animation = Animation::read(bytes, container)?;
    let info = animation.info();
    limits.check_info(&info)?;
    crate::check_indices(wanted, info.total_frames)?;
    if info.width == 0 || info.height == 0 {
        return Err(VideoError::InvalidSize {
            width: info.width,
            height: info.height,
        });
    }
    let frames = match container {
        Container::WebP => decode_webp(bytes, &animation, wanted)?,
        _ => decode_gif(bytes, &animation, wanted)?,
    };
    Ok((info, frames))
}

/// One composited canvas: its pixels, bytes per pixel (3 or 4) and delay.
struct Canvas {
    pixels: Vec<u8>,
    channels: usize,
    delay_ms: u32,
}

/// Keeps every wanted frame of the canvases `next_canvas` yields, in order.
fn keep_wanted(
    animation: &Animation,
    wanted: &[u64],
    mut next_canvas: impl FnMut() -> Option<Result<Canvas, VideoError>>,
) -> Result<Frames, VideoError> {
    let mut frames = Frames::with_capacity(animation.width, animation.height, wanted.len());
    let mut rgb = Vec::with_capacity(frames.frame_len());
    let mut time_ms = 0u64;
    let mut index = 0u64;
    while let Some(&next) = wanted.get(frames.count) {
        let Some(canvas) = next_canvas() else {
            return Err(VideoError::IndexOutOfRange {
                index: next,
                total_frames: index,
            });
        };
        let canvas = canvas?;
        if index == next {
            rgb.clear();
            rgb.extend(
                canvas
                    .pixels
                    .chunks_exact(canvas.channels)
                    .flat_map(|p| [p[0], p[1], p[2]]),
            );
            if rgb.len() != frames.frame_len() {
                return Err(corrupt(
                    animation.container,
                    "compositing frames",
                    "a frame does not match the canvas size",
                ));
            }
            frames.push(&rgb, time_ms as f64 / 1000.0);
        }
        time_ms += u64::from(canvas.delay_ms);
        index += 1;
    }
    Ok(frames)
}

fn decode_gif(bytes: &[u8], animation: &Animation, wanted: &[u64]) -> Result<Frames, VideoError> {
    let bad = |e: image::ImageError| corrupt(Container::Gif, "decoding the GIF frames", e);
    let decoder = image::codecs::gif::GifDecoder::new(Cursor::new(bytes)).map_err(bad)?;
    let mut iter = decoder.into_frames();
    let mut delays = animation.delays_ms.iter().copied();
    keep_wanted(animation, wanted, || {
        let frame = iter.next()?;
        let delay_ms = delays.next().unwrap_or(0);
        Some(frame.map_err(bad).map(|f| Canvas {
            pixels: f.into_buffer().into_raw(),
            channels: 4,
            delay_ms,
        }))
    })
}

fn decode_webp(bytes: &[u8], animation: &Animation, wanted: &[u64]) -> Result<Frames, VideoError> {
    let bad =
        |e: image_webp::DecodingError| corrupt(Container::WebP, "decoding the WebP frames", e);
    let mut decoder = webp_decoder(bytes)?;
    let channels = if decoder.has_alpha() { 4 } else { 3 };
    let size = decoder.output_buffer_size().ok_or_else(|| {
        corrupt(
            Container::WebP,
            "decoding the WebP frames",
            "image too large",
        )
    })?;
    let animated = decoder.is_animated();
    let mut remaining = animation.delays_ms.len();
    keep_wanted(animation, wanted, || {
        remaining = remaining.checked_sub(1)?;
        let mut pixels = vec![0u8; size];
        let delay = if animated {
            decoder.read_frame(&mut pixels)
        } else {
            decoder.read_image(&mut pixels).map(|()| STILL_DELAY_MS)
        };
        Some(delay.map_err(bad).map(|delay_ms| Canvas {
            pixels,
            channels,
            delay_ms,
        }))
    })
}
