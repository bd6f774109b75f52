//! EXIF orientation, applied as Pillow's `ImageOps.exif_transpose` does.

use crate::scratch::ensure_len;

/// The eight EXIF orientations (tag 0x0112 values 1–8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Orientation {
    /// 1: as stored.
    #[default]
    Normal,
    /// 2: mirrored left-right.
    FlipH,
    /// 3: rotated 180°.
    Rotate180,
    /// 4: mirrored top-bottom.
    FlipV,
    /// 5: transposed (x and y swapped).
    Transpose,
    /// 6: needs 90° clockwise rotation.
    Rotate90,
    /// 7: transversed (anti-diagonal mirror).
    Transverse,
    /// 8: needs 90° anticlockwise rotation.
    Rotate270,
}

impl Orientation {
    /// From the EXIF tag value; unknown values mean no transform (as Pillow).
    pub fn from_exif(value: u8) -> Orientation {
        match value {
            2 => Orientation::FlipH,
            3 => Orientation::Rotate180,
            4 => Orientation::FlipV,
            5 => Orientation::Transpose,
            6 => Orientation::Rotate90,
            7 => Orientation::Transverse,
            8 => Orientation::Rotate270,
            _ => Orientation::Normal,
        }
    }

    /// From a raw EXIF block starting at the TIFF header.
    pub(crate) fn from_exif_block(block: &[u8]) -> Orientation {
        image::metadata::Orientation::from_exif_chunk(block)
            .map(|o| Orientation::from_exif(o.to_exif()))
            .unwrap_or_default()
    }

    /// Whether the transform turns a `w`×`h` image into an `h`×`w` one.
    pub(crate) fn swaps_axes(self) -> bool {
        matches!(
            self,
            Orientation::Transpose
                | Orientation::Rotate90
                | Orientation::Transverse
                | Orientation::Rotate270
        )
    }

    /// Reorients the `w`×`h` RGB8 image in `img` (using `tmp`), returns the new size.
    pub(crate) fn apply(
        self,
        img: &mut Vec<u8>,
        tmp: &mut Vec<u8>,
        w: usize,
        h: usize,
    ) -> (usize, usize) {
        if self == Orientation::Normal {
            return (w, h);
        }
        let (ow, oh) = if self.swaps_axes() { (h, w) } else { (w, h) };
        ensure_len(tmp, ow * oh * 3);
        for y in 0..oh {
            for x in 0..ow {
                let (sx, sy) = self.source(x, y, w, h);
                let (d, s) = ((y * ow + x) * 3, (sy * w + sx) * 3);
                tmp[d..d + 3].copy_from_slice(&img[s..s + 3]);
            }
        }
        std::mem::swap(img, tmp);
        (ow, oh)
    }

    /// Source pixel of destination (`x`, `y`) for a `w`×`h` source.
    fn source(self, x: usize, y: usize, w: usize, h: usize) -> (usize, usize) {
        match self {
            Orientation::Normal => (x, y),
            Orientation::FlipH => (w - 1 - x, y),
            Orientation::Rotate180 => (w - 1 - x, h - 1 - y),
            Orientation::FlipV => (x, h - 1 - y),
            Orientation::Transpose => (y, x),
            Orientation::Rotate90 => (y, h - 1 - x),
            Orientation::Transverse => (w - 1 - y, h - 1 - x),
            Orientation::Rotate270 => (w - 1 - y, x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2×1 image: red, green. Rotating 90° clockwise gives a 1×2 column red over green.
    #[test]
    fn rotations_move_pixels_as_exif_says() {
        let src = vec![255, 0, 0, 0, 255, 0];
        let mut img = src.clone();
        let mut tmp = Vec::new();
        assert_eq!(
            Orientation::Rotate90.apply(&mut img, &mut tmp, 2, 1),
            (1, 2)
        );
        assert_eq!(img, src);
        let mut img = src.clone();
        assert_eq!(
            Orientation::Rotate270.apply(&mut img, &mut tmp, 2, 1),
            (1, 2)
        );
        assert_eq!(img, vec![0, 255, 0, 255, 0, 0]);
        let mut img = src.clone();
        assert_eq!(Orientation::FlipH.apply(&mut img, &mut tmp, 2, 1), (2, 1));
        assert_eq!(img, vec![0, 255, 0, 255, 0, 0]);
    }
}
