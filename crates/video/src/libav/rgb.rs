//! Converting decoded pictures to packed RGB24 with libswscale, the way
//! PyAV's `frame.to_ndarray(format="rgb24")` does: same size, bilinear
//! flag, the frame's own colour matrix and range.

use std::ffi::c_int;

use ffmpeg_next::format::Pixel;
use ffmpeg_next::software::scaling::{Context, Flags};
use ffmpeg_next::util::frame::video::Video;
use ffmpeg_next::{ffi, util::color};

use crate::error::VideoError;
use crate::libav::library;

/// A scaler kept across frames of one format, and its output picture.
pub(crate) struct RgbConverter {
    scaler: Option<(Context, Pixel, color::Space, color::Range)>,
    out: Video,
}

impl RgbConverter {
    pub(crate) fn new() -> Self {
        RgbConverter {
            scaler: None,
            out: Video::empty(),
        }
    }

    /// Converts `frame` and hands its RGB rows, packed, to `sink`.
    pub(crate) fn convert(&mut self, frame: &Video, sink: &mut Vec<u8>) -> Result<(), VideoError> {
        let key = (frame.format(), frame.color_space(), frame.color_range());
        let stale = match &self.scaler {
            Some((_, f, s, r)) => (*f, *s, *r) != key,
            None => true,
        };
        if stale {
            self.scaler = Some((scaler_for(frame)?, key.0, key.1, key.2));
            self.out = Video::empty();
        }
        let Some((scaler, ..)) = self.scaler.as_mut() else {
            return Err(library("no scaler"));
        };
        scaler
            .run(frame, &mut self.out)
            .map_err(|e| library(&format!("converting a frame to RGB: {e}")))?;
        let row = frame.width() as usize * 3;
        let stride = self.out.stride(0);
        let data = self.out.data(0);
        for y in 0..frame.height() as usize {
            sink.extend_from_slice(&data[y * stride..y * stride + row]);
        }
        Ok(())
    }
}

/// A same-size scaler from `frame`'s format to RGB24 with its colour
/// matrix (BT.601 when unspecified) and range.
fn scaler_for(frame: &Video) -> Result<Context, VideoError> {
    let (w, h) = (frame.width(), frame.height());
    let mut scaler = Context::get(frame.format(), w, h, Pixel::RGB24, w, h, Flags::BILINEAR)
        .map_err(|e| library(&format!("no RGB conversion from {:?}: {e}", frame.format())))?;
    let space = match frame.color_space() {
        color::Space::Unspecified | color::Space::Reserved => ffi::SWS_CS_DEFAULT as c_int,
        other => ffi::AVColorSpace::from(other) as c_int,
    };
    let full_range = c_int::from(frame.color_range() == color::Range::JPEG);
    // SAFETY: the scaler context is valid; sws_getCoefficients returns a
    // pointer to a static table; the details only read those tables.
    unsafe {
        let table = ffi::sws_getCoefficients(space);
        ffi::sws_setColorspaceDetails(
            scaler.as_mut_ptr(),
            table,
            full_range,
            table,
            1,
            0,
            1 << 16,
            1 << 16,
        );
    }
    Ok(scaler)
}
