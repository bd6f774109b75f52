//! A borrowed view of packed 8-bit RGB pixels, the currency between decode,
//! resize and the processors.

use crate::error::VisionError;

/// Packed RGB8 pixels, row-major, no padding: `data.len() == width * height * 3`.
#[derive(Clone, Copy, Debug)]
pub struct RgbView<'a> {
    data: &'a [u8],
    width: usize,
    height: usize,
}

impl<'a> RgbView<'a> {
    /// Wraps `data` as a `width`×`height` RGB image; refuses a length mismatch or zero size.
    pub fn new(data: &'a [u8], width: usize, height: usize) -> Result<Self, VisionError> {
        if width == 0 || height == 0 {
            return Err(VisionError::ZeroSize {
                format: "RGB",
                width: width as u64,
                height: height as u64,
            });
        }
        let expected = width
            .checked_mul(height)
            .and_then(|p| p.checked_mul(3))
            .ok_or_else(|| VisionError::Geometry(format!("{width}x{height} overflows")))?;
        if data.len() != expected {
            return Err(VisionError::Geometry(format!(
                "RGB buffer of {} bytes does not hold {width}x{height} pixels ({expected} bytes)",
                data.len()
            )));
        }
        Ok(RgbView {
            data,
            width,
            height,
        })
    }

    /// Views an `image::RgbImage`.
    pub fn from_image(image: &'a image::RgbImage) -> Result<Self, VisionError> {
        Self::new(
            image.as_raw(),
            image.width() as usize,
            image.height() as usize,
        )
    }

    /// The pixel bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Copies the pixels into an owned `image::RgbImage`.
    pub fn to_image(&self) -> Result<image::RgbImage, VisionError> {
        let w = u32::try_from(self.width).map_err(|_| VisionError::Geometry("width".into()))?;
        let h = u32::try_from(self.height).map_err(|_| VisionError::Geometry("height".into()))?;
        image::RgbImage::from_raw(w, h, self.data.to_vec())
            .ok_or_else(|| VisionError::Geometry("buffer size mismatch".into()))
    }

    /// Crops a `width`×`height` window at (`left`, `top`) into `out`.
    pub(crate) fn crop_into(
        &self,
        left: usize,
        top: usize,
        width: usize,
        height: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), VisionError> {
        if left + width > self.width || top + height > self.height {
            return Err(VisionError::Geometry(format!(
                "crop {width}x{height}+{left}+{top} outside {}x{}",
                self.width, self.height
            )));
        }
        out.clear();
        for y in top..top + height {
            let start = (y * self.width + left) * 3;
            out.extend_from_slice(&self.data[start..start + width * 3]);
        }
        Ok(())
    }
}
