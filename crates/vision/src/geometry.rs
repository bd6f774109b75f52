//! Target-size arithmetic of the reference processors: Qwen's smart resize and
//! CLIP's shortest-edge resize with centre crop.

use crate::error::VisionError;

/// Largest aspect ratio the Qwen reference accepts (`max/min > 200` is an error).
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// Qwen2-VL `smart_resize`: returns `(height, width)`, both multiples of
/// `factor`, with the pixel count brought inside `[min_pixels, max_pixels]`.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), VisionError> {
    smart_resize_f64(height, width, factor, min_pixels as f64, max_pixels as f64)
}

/// [`smart_resize`] with bounds that need not be integers (the per-frame
/// budget derived from a video's `total_pixels` is a quotient).
pub fn smart_resize_f64(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: f64,
    max_pixels: f64,
) -> Result<(usize, usize), VisionError> {
    if height == 0 || width == 0 {
        return Err(VisionError::Geometry(format!(
            "image is {width}x{height}: a side is zero"
        )));
    }
    if factor == 0 {
        return Err(VisionError::Config("resize factor is zero".into()));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(VisionError::Geometry(format!(
            "aspect ratio {ratio:.3} of {width}x{height} exceeds {MAX_ASPECT_RATIO}"
        )));
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels {
        let beta = (h * w / max_pixels).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < 1.0 || w_bar < 1.0 {
        return Err(VisionError::Config(format!(
            "smart resize of {width}x{height} gives an empty image (min_pixels {min_pixels}, max_pixels {max_pixels})"
        )));
    }
    if h_bar > u32::MAX as f64 || w_bar > u32::MAX as f64 {
        return Err(VisionError::Config(format!(
            "smart resize of {width}x{height} gives an absurd size (min_pixels {min_pixels})"
        )));
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// CLIP's `get_resize_output_image_size(default_to_square=False)`: the
/// shorter side becomes `shortest_edge`, the longer one is scaled and
/// truncated. Returns `(height, width)`.
pub fn shortest_edge_size(height: usize, width: usize, shortest_edge: usize) -> (usize, usize) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    let new_long = (shortest_edge as f64 * long as f64 / short as f64) as usize;
    if width <= height {
        (new_long, shortest_edge)
    } else {
        (shortest_edge, new_long)
    }
}

/// Top-left corner of a centred `crop_h`×`crop_w` window, as the reference's
/// `center_crop` places it (`(size - crop) // 2`).
pub fn centre_crop_origin(
    height: usize,
    width: usize,
    crop_h: usize,
    crop_w: usize,
) -> Option<(usize, usize)> {
    if crop_h > height || crop_w > width {
        return None;
    }
    Some(((height - crop_h) / 2, (width - crop_w) / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_examples_from_the_reference() {
        assert_eq!(
            smart_resize(768, 1024, 28, 3136, 12_845_056).unwrap(),
            (756, 1036)
        );
        assert_eq!(
            smart_resize(1080, 1920, 28, 3136, 1_003_520).unwrap(),
            (728, 1316)
        );
        assert_eq!(
            smart_resize(1080, 1920, 32, 65_536, 16_777_216).unwrap(),
            (1088, 1920)
        );
    }

    #[test]
    fn tiny_images_grow_to_min_pixels() {
        assert_eq!(smart_resize(1, 1, 28, 3136, 1_003_520).unwrap(), (56, 56));
    }

    #[test]
    fn refuses_extreme_aspect_and_zero() {
        assert!(smart_resize(1, 4000, 28, 3136, 1_003_520).is_err());
        assert!(smart_resize(0, 10, 28, 3136, 1_003_520).is_err());
    }

    #[test]
    fn clip_shortest_edge_and_crop() {
        assert_eq!(shortest_edge_size(400, 600, 336), (336, 504));
        assert_eq!(shortest_edge_size(600, 400, 336), (504, 336));
        assert_eq!(centre_crop_origin(336, 504, 336, 336), Some((0, 84)));
        assert_eq!(centre_crop_origin(300, 504, 336, 336), None);
    }
}
