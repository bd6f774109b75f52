//! The shared path of the processors whose output is a stack of planar
//! frames: CLIP, LLaVA-NeXT / OneVision, Gemma 3, Idefics3, InternVL,
//! Llama 4 and Pixtral (every family but Qwen, whose patch rows are fused
//! with its resize).
//!
//! A family says what differs ([`Tiled`]): how an image of a given size is
//! planned, the output layout of a plan, and how the image is cut into
//! 8-bit frames. This module does the rest, once for all of them: the
//! [`Processor`] methods, writing every frame normalised into planar
//! `[3, H, W]` in the requested dtype, stacking the frames for
//! [`Processor::resized_image`], and the peak-memory sum. The frames'
//! count and size come from the layout's shape: `[frames, 3, H, W]`, or
//! `[3, H, W]` for a single frame.
//!
//! An image with a side of zero pixels is refused before any family plans
//! it. Helpers the families share: [`cut_tiles`] (a canvas cut into tiles row by row), [`pad_into`] (an
//! image at the top left of a padded canvas) and [`with_global`] (tiles
//! plus a global frame when there are several).

use crate::error::VisionError;
use crate::image::RgbView;
use crate::layout::{planar_chw, planar_rows};
use crate::normalize::{Lut, Normalization, OutElem};
use crate::output::{ItemTensor, OutputDtype, OutputLayout, PixelValues, PreprocessOutput};
use crate::placeholders::PlaceholderLayout;
use crate::pool::PooledVec;
use crate::processor::{
    decode_then_preprocess, fingerprint_of, split_image, streamable_rows, PreprocessOptions,
    Processor,
};
use crate::resize::{self, Bicubic, RowSource};
use crate::scratch::{ensure_len, with_scratch, Scratch};

/// What a family's frames are handed to: `(index, frame)`.
pub(crate) type Each<'a> = &'a mut dyn FnMut(usize, RgbView<'_>);

/// A processor that cuts an image into planar frames of one size: what a
/// family decides; [`Processor`] follows from it.
pub(crate) trait Tiled: Send + Sync {
    /// What an image of a given size becomes, before any pixel is touched.
    type Plan;

    /// [`Processor::name`].
    fn name(&self) -> &'static str;

    /// The family's settings that change its output under `opts`, as text:
    /// with the normalisation and the options every family shares, the
    /// [`Processor::fingerprint`].
    fn settings(&self, opts: &PreprocessOptions) -> String;

    /// Rescale, mean and std.
    fn norm(&self) -> &Normalization;

    /// The plan for a decoded (oriented) `(width, height)` image; refuses
    /// what the reference refuses.
    fn plan(
        &self,
        size: (usize, usize),
        opts: &PreprocessOptions,
    ) -> Result<Self::Plan, VisionError>;

    /// The output layout of `plan`.
    fn layout(&self, plan: &Self::Plan) -> OutputLayout;

    /// The `(width, height)` the image was resized to under `plan`
    /// ([`PreprocessOutput::resized_size`]).
    fn resized_size(&self, plan: &Self::Plan) -> (usize, usize);

    /// Peak bytes of the buffers cutting an `input` (`(width, height)`)
    /// image into its frames under `plan` takes, the output tensor aside.
    fn buffer_bytes(&self, plan: &Self::Plan, input: (u64, u64)) -> u64;

    /// Produces the 8-bit frames of the cut's image, in output order, and
    /// hands each to `each`.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError>;

    /// When this plan's tensor is one frame made by one resize of the whole
    /// image (a window of it kept), written by [`Tiled::write`]'s default:
    /// that resize. A JPEG's rows then go from the decoder straight into
    /// the resize, and the decoded image is never stored whole
    /// ([`resize::resize_window_rows`]). `None` (the default): the image
    /// is decoded whole and cut by [`Tiled::frames`].
    fn one_resize(&self, _plan: &Self::Plan) -> Option<resize::WindowedResize> {
        None
    }

    /// When this plan's frames are all cut from resizes of the whole
    /// image: their filter and `(width, height)`s, in the order
    /// [`Tiled::cut_resized`] takes them. The image's rows are then read
    /// once for all of them ([`resize::resize_many`]; a JPEG's straight
    /// from the decoder, never stored whole) and [`cut_frames`] cuts
    /// the frames. `None` (the default): [`Tiled::frames`] alone.
    fn whole_resizes(&self, _plan: &Self::Plan) -> Option<(Bicubic, Vec<(usize, usize)>)> {
        None
    }

    /// Cuts the frames, in output order, from the images
    /// [`Tiled::whole_resizes`] asked for (`resized`, in its order), with
    /// `buf` as scratch, and hands each to `each`.
    fn cut_resized(
        &self,
        _plan: &Self::Plan,
        _resized: &[RgbView<'_>],
        _buf: &mut Vec<u8>,
        _each: Each<'_>,
    ) -> Result<(), VisionError> {
        Err(VisionError::Geometry(format!(
            "{}: no whole-image resizes to cut frames from",
            self.name()
        )))
    }

    /// The normalisation tables: by default the slow processors'
    /// arithmetic ([`Normalization::value`]).
    fn lut<T: OutElem>(&self) -> Lut<T> {
        self.norm().lut()
    }

    /// Writes the tensor into `out`: by default every frame normalised
    /// through [`Tiled::lut`], planar, one after the other.
    fn write<T: OutElem>(
        &self,
        cut: &mut Cut<'_, Self::Plan>,
        out: &mut [T],
    ) -> Result<(), VisionError> {
        write_frames(self, cut, out)
    }

    /// [`Processor::placeholder_layout`]: by default the image token,
    /// repeated once per placeholder token.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        PlaceholderLayout::repeated(layout.num_placeholder_tokens)
    }

    /// [`Processor::item_tensors`]: none by default.
    fn item_tensors(&self, _layout: &OutputLayout) -> Vec<ItemTensor> {
        Vec::new()
    }
}

/// One image being cut: the image, its plan, the frames' count and size,
/// whether to split the work across threads, and the scratch buffers.
pub(crate) struct Cut<'a, Plan> {
    pub(crate) image: RgbView<'a>,
    pub(crate) plan: &'a Plan,
    pub(crate) frames: Frames,
    pub(crate) parallel: bool,
    pub(crate) scratch: &'a mut Scratch,
}

/// How many frames a layout holds and their `(width, height)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frames {
    count: usize,
    width: usize,
    height: usize,
}

impl Frames {
    /// From the shape `[frames, 3, H, W]` or `[3, H, W]`.
    fn of(layout: &OutputLayout) -> Frames {
        match layout.shape[..] {
            [count, _, height, width] => Frames {
                count,
                width,
                height,
            },
            [_, height, width] => Frames {
                count: 1,
                width,
                height,
            },
            _ => Frames {
                count: 0,
                width: 0,
                height: 0,
            },
        }
    }

    /// Elements of one planar frame.
    pub(crate) fn len(&self) -> usize {
        3 * self.width * self.height
    }
}

impl<P: Tiled> Processor for P {
    fn name(&self) -> &'static str {
        Tiled::name(self)
    }

    fn fingerprint(&self, opts: &PreprocessOptions) -> u64 {
        fingerprint_of(format_args!("{}", self.settings(opts)), self.norm(), opts)
    }

    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        Tiled::placeholder_layout(self, layout)
    }

    fn item_tensors(&self, layout: &OutputLayout) -> Vec<ItemTensor> {
        Tiled::item_tensors(self, layout)
    }

    fn working_bytes(&self, w: u32, h: u32, opts: &PreprocessOptions) -> Result<u64, VisionError> {
        let plan = planned(self, (w as usize, h as usize), opts)?;
        let elements = self.layout(&plan).shape.iter().product::<usize>() as u64;
        let output = elements * opts.dtype.size() as u64;
        Ok(self.buffer_bytes(&plan, (u64::from(w), u64::from(h))) + output)
    }

    fn layout_for(
        &self,
        w: usize,
        h: usize,
        o: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError> {
        Ok(self.layout(&planned(self, (w, h), o)?))
    }

    /// The 8-bit frames stacked top to bottom.
    fn resized_image(
        &self,
        image: &image::RgbImage,
        o: &PreprocessOptions,
    ) -> Result<image::RgbImage, VisionError> {
        let image = RgbView::from_image(image)?;
        let plan = planned(self, (image.width(), image.height()), o)?;
        let frames = Frames::of(&self.layout(&plan));
        let mut scratch = Scratch::default();
        let mut cut = Cut {
            image,
            plan: &plan,
            frames,
            parallel: false,
            scratch: &mut scratch,
        };
        let mut stacked = Vec::with_capacity(frames.count * frames.len());
        self.frames(&mut cut, &mut |_, frame| {
            stacked.extend_from_slice(frame.data())
        })?;
        let rows = stacked.len() / (3 * frames.width).max(1);
        RgbView::new(&stacked, frames.width, rows)?.to_image()
    }

    fn preprocess_bytes(
        &self,
        bytes: &[u8],
        opts: &PreprocessOptions,
    ) -> Result<PreprocessOutput, VisionError> {
        with_scratch(|s| match streamed(self, bytes, opts, s)? {
            Some(output) => Ok(output),
            None => decode_then_preprocess(self, bytes, opts, s),
        })
    }

    fn preprocess_view(
        &self,
        image: RgbView<'_>,
        o: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError> {
        let plan = planned(self, (image.width(), image.height()), o)?;
        let layout = self.layout(&plan);
        let mut cut = Cut {
            image,
            plan: &plan,
            frames: Frames::of(&layout),
            parallel: split_image(o, image.width() * image.height()),
            scratch,
        };
        let pixel_values = match o.dtype {
            OutputDtype::F32 => PixelValues::F32(written(self, &mut cut)?),
            OutputDtype::Bf16 => PixelValues::Bf16(written(self, &mut cut)?),
        };
        let resized = self.resized_size(&plan);
        Ok(PreprocessOutput::from_layout(pixel_values, layout, resized))
    }
}

/// A JPEG streamed from its decoder through the family's one resize
/// ([`Tiled::one_resize`]) or its whole-image resizes
/// ([`Tiled::whole_resizes`]), or `None` when this image or plan does not
/// stream (not a single-scan JPEG, rotated, a resize the rows cannot feed,
/// a size equal to the image's) and must be decoded whole. An image alone
/// in the pool (`intra_image_parallel`, ≥ 1 Mpixel) has its rows decoded
/// ahead on a helper thread ([`crate::processor::StreamRows`]).
fn streamed<P: Tiled>(
    p: &P,
    bytes: &[u8],
    o: &PreprocessOptions,
    s: &mut Scratch,
) -> Result<Option<PreprocessOutput>, VisionError> {
    let Some(rows) = streamable_rows(bytes, o)? else {
        return Ok(None);
    };
    let input = (rows.width(), rows.height());
    let plan = planned(p, input, o)?;
    let layout = p.layout(&plan);
    let frames = Frames::of(&layout);
    if let Some((filter, sizes)) = p.whole_resizes(&plan) {
        // A size equal to the image's would be a copy of every row: the
        // image decoded whole serves as it is.
        if !resize::shares_rows(filter, input, &sizes) || sizes.contains(&input) {
            return Ok(None);
        }
        let scratch = (&mut s.decoded, &mut s.inter, &mut s.resized);
        rows.run(|src| resize::resize_many_rows(src, filter, &sizes, scratch))?;
        let resized = resize::views(&s.resized, &sizes, None)?;
        let pixel_values = match o.dtype {
            OutputDtype::F32 => {
                PixelValues::F32(cut_written(p, &plan, frames, &resized, &mut s.cropped)?)
            }
            OutputDtype::Bf16 => {
                PixelValues::Bf16(cut_written(p, &plan, frames, &resized, &mut s.cropped)?)
            }
        };
        let resized_size = p.resized_size(&plan);
        return Ok(Some(PreprocessOutput::from_layout(
            pixel_values,
            layout,
            resized_size,
        )));
    }
    let Some(resize) = p.one_resize(&plan).filter(|r| r.streams(input)) else {
        return Ok(None);
    };
    let (_, _, width, height) = resize.window;
    if frames.count != 1 || (frames.width, frames.height) != (width, height) {
        return Err(VisionError::Geometry(format!(
            "{}: a {width}x{height} resize for {} frames of {}x{}",
            p.name(),
            frames.count,
            frames.width,
            frames.height
        )));
    }
    let pixel_values = rows.run(|src| {
        Ok::<_, VisionError>(match o.dtype {
            OutputDtype::F32 => PixelValues::F32(one_frame(p, src, &resize, frames, s)?),
            OutputDtype::Bf16 => PixelValues::Bf16(one_frame(p, src, &resize, frames, s)?),
        })
    })?;
    Ok(Some(PreprocessOutput::from_layout(
        pixel_values,
        layout,
        p.resized_size(&plan),
    )))
}

/// The one frame `resize` makes of `rows`, each band normalised into its
/// rows of a recycled buffer as [`write_frames`] writes a frame.
fn one_frame<P: Tiled, T: OutElem>(
    p: &P,
    rows: &mut dyn RowSource,
    resize: &resize::WindowedResize,
    frames: Frames,
    s: &mut Scratch,
) -> Result<PooledVec<T>, VisionError> {
    let mut out = PooledVec::<T>::take(frames.len());
    let lut = p.lut::<T>();
    let scratch = (&mut s.decoded, &mut s.inter);
    resize::resize_window_rows(rows, resize, scratch, |first, band| {
        planar_rows(band, &lut, &mut out[..], first)
    })?;
    Ok(out)
}

/// The tensor of the frames `p` cuts from `resized`
/// ([`Tiled::cut_resized`]) in a recycled buffer, each normalised as
/// [`write_frames`] writes a frame.
fn cut_written<P: Tiled, T: OutElem>(
    p: &P,
    plan: &P::Plan,
    frames: Frames,
    resized: &[RgbView<'_>],
    buf: &mut Vec<u8>,
) -> Result<PooledVec<T>, VisionError> {
    let mut out = PooledVec::<T>::take(frames.count * frames.len());
    let lut = p.lut::<T>();
    p.cut_resized(
        plan,
        resized,
        buf,
        &mut frame_writer(&mut out, frames, &lut),
    )?;
    Ok(out)
}

/// [`Tiled::frames`] of a family that cuts its frames from whole-image
/// resizes ([`Tiled::whole_resizes`]): every resize from one read of the
/// cut's image, or one after the other when one of them runs vertically
/// first; a size equal to the image's is the image itself.
pub(crate) fn cut_frames<P: Tiled + ?Sized>(
    p: &P,
    cut: &mut Cut<'_, P::Plan>,
    each: Each<'_>,
) -> Result<(), VisionError> {
    let Some((filter, sizes)) = p.whole_resizes(cut.plan) else {
        return Err(VisionError::Geometry(format!(
            "{}: this plan's frames are not cut from whole-image resizes",
            p.name()
        )));
    };
    let image = cut.image;
    let (inter, resized, cropped, raw) = cut.scratch.buffers();
    if resize::shares_rows(filter, (image.width(), image.height()), &sizes) {
        resize::resize_many(image, filter, &sizes, (inter, resized), cut.parallel)?;
    } else {
        resized.clear();
        let unchanged = (image.width(), image.height());
        for &size in sizes.iter().filter(|&&size| size != unchanged) {
            resize::resize_copy(filter, image, size, inter, raw, cut.parallel)?;
            resized.extend_from_slice(raw);
        }
    }
    let views = resize::views(resized, &sizes, Some(image))?;
    p.cut_resized(cut.plan, &views, cropped, each)
}

/// The cut's tensor in a recycled buffer ([`Tiled::write`]).
fn written<P: Tiled, T: OutElem>(
    p: &P,
    cut: &mut Cut<'_, P::Plan>,
) -> Result<PooledVec<T>, VisionError> {
    let mut out = PooledVec::<T>::take(cut.frames.count * cut.frames.len());
    p.write(cut, &mut out)?;
    Ok(out)
}

/// [`Tiled::write`]'s default: every frame `p` hands out, normalised
/// through [`Tiled::lut`], planar, at its index's place in `out`.
pub(crate) fn write_frames<P: Tiled + ?Sized, T: OutElem>(
    p: &P,
    cut: &mut Cut<'_, P::Plan>,
    out: &mut [T],
) -> Result<(), VisionError> {
    let lut = p.lut::<T>();
    let mut write = frame_writer(out, cut.frames, &lut);
    p.frames(cut, &mut write)
}

/// What a frame handed out as `(index, frame)` goes to: normalised
/// through `lut`, planar, at its index's place in `out`.
fn frame_writer<'a, T: OutElem>(
    out: &'a mut [T],
    frames: Frames,
    lut: &'a Lut<T>,
) -> impl FnMut(usize, RgbView<'_>) + 'a {
    let per = frames.len();
    move |i, frame| {
        if let Some(chunk) = out.get_mut(i * per..(i + 1) * per) {
            planar_chw(frame, lut, chunk);
        }
    }
}

/// [`Tiled::plan`] after the refusal every tiled family shares: an image
/// with a side of zero pixels.
fn planned<P: Tiled + ?Sized>(
    p: &P,
    (w, h): (usize, usize),
    opts: &PreprocessOptions,
) -> Result<P::Plan, VisionError> {
    check_sides(w, h)?;
    p.plan((w, h), opts)
}

/// Refuses an image with a side of zero pixels.
fn check_sides(width: usize, height: usize) -> Result<(), VisionError> {
    if width == 0 || height == 0 {
        return Err(VisionError::Geometry(format!(
            "image is {width}x{height}: a side is zero"
        )));
    }
    Ok(())
}

/// Frames of `tiles` tiles and a global frame after them when there are
/// several (InternVL's thumbnail, Llama 4's global tile).
pub(crate) fn with_global(tiles: usize) -> usize {
    match tiles {
        1 => 1,
        n => n + 1,
    }
}

/// [`Tiled::cut_resized`]'s images for a plan of `tiles` tiles with a
/// global frame after them when there are several ([`with_global`]): the
/// image the tiles come from, and the global frame's. Refuses any other
/// count.
pub(crate) fn tiles_and_global<'a>(
    name: &str,
    tiles: usize,
    resized: &[RgbView<'a>],
) -> Result<(RgbView<'a>, Option<RgbView<'a>>), VisionError> {
    match (tiles, resized) {
        (1, &[whole]) => Ok((whole, None)),
        (n, &[whole, global]) if n > 1 => Ok((whole, Some(global))),
        _ => Err(VisionError::Geometry(format!(
            "{name}: {} resized images for {tiles} tiles",
            resized.len()
        ))),
    }
}

/// Cuts `canvas` (whole tiles on both sides) into `(width, height)`
/// tiles row by row, through `buf`, handing tile `i` to `each` as index
/// `i`. Returns the number of tiles.
pub(crate) fn cut_tiles(
    canvas: RgbView<'_>,
    (tw, th): (usize, usize),
    buf: &mut Vec<u8>,
    each: &mut dyn FnMut(usize, RgbView<'_>),
) -> Result<usize, VisionError> {
    let cols = canvas.width() / tw;
    let tiles = cols * (canvas.height() / th);
    for i in 0..tiles {
        canvas.crop_into((i % cols) * tw, (i / cols) * th, tw, th, buf)?;
        each(i, RgbView::new(buf, tw, th)?);
    }
    Ok(tiles)
}

/// Peak bytes of a padded canvas's frames (Phi-4): resizing an
/// `input` image to `resized` (`(width, height)`), the canvas of `tiles`
/// square tiles of `side` it is padded into, and one tile cut from it.
pub(crate) fn padded_canvas_bytes(
    input: (u64, u64),
    (w, h): (usize, usize),
    tiles: usize,
    side: usize,
) -> u64 {
    let (w, h, tile) = (w as u64, h as u64, 3 * (side * side) as u64);
    resize::working_bytes(input, (w, h)) + tiles as u64 * tile + tile
}

/// `src` (`w`×`h`) at the top left of a `canvas_w`×`canvas_h` image of
/// `fill` (every channel) in `out`: Phi-4's white padding.
pub(crate) fn pad_into(
    src: &[u8],
    (w, h): (usize, usize),
    (canvas_w, canvas_h): (usize, usize),
    fill: u8,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.resize(canvas_w * canvas_h * 3, fill);
    for (y, row) in src.chunks_exact(w * 3).take(h.min(canvas_h)).enumerate() {
        let start = y * canvas_w * 3;
        let len = row.len().min(canvas_w * 3);
        out[start..start + len].copy_from_slice(&row[..len]);
    }
}

/// Writes the `tile`×`tile` window at canvas position `origin` (row,
/// column) of a canvas that is black except for `src` pasted at `offset`
/// (row, column) into `out`: every byte once, the image's or a zero.
pub(crate) fn padded_tile(
    src: RgbView<'_>,
    offset: (usize, usize),
    origin: (usize, usize),
    tile: usize,
    out: &mut Vec<u8>,
) {
    ensure_len(out, tile * tile * 3);
    let (oy, ox) = offset;
    let (top, left) = origin;
    // Canvas columns the window shares with the pasted image.
    let x0 = left.max(ox).min(left + tile);
    let x1 = (left + tile).min(ox + src.width()).max(x0);
    let (before, len) = ((x0 - left) * 3, (x1 - x0) * 3);
    let data = src.data();
    for (row, dst) in out.chunks_exact_mut(tile * 3).enumerate() {
        let y = top + row;
        if y < oy || y >= oy + src.height() || len == 0 {
            dst.fill(0);
            continue;
        }
        let from = ((y - oy) * src.width() + (x0 - ox)) * 3;
        let (head, rest) = dst.split_at_mut(before);
        let (body, tail) = rest.split_at_mut(len);
        head.fill(0);
        body.copy_from_slice(&data[from..from + len]);
        tail.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    #[test]
    fn frames_come_from_the_shape() {
        let layout = |shape: Vec<usize>| OutputLayout {
            shape,
            image_grid_thw: None,
            num_placeholder_tokens: 0,
            image_sizes: None,
            tile_grid: None,
            content_size: None,
        };
        let f = Frames::of(&layout(vec![5, 3, 20, 30]));
        assert_eq!((f.count, f.width, f.height, f.len()), (5, 30, 20, 1800));
        let f = Frames::of(&layout(vec![3, 16, 48]));
        assert_eq!((f.count, f.width, f.height), (1, 48, 16));
        assert_eq!(Frames::of(&layout(vec![7])).count, 0);
    }

    #[test]
    fn tiles_are_cut_row_by_row() {
        // A 4×2 canvas of 2×1 tiles: pixel value = its x + 10·y.
        let data: Vec<u8> = (0..2u8)
            .flat_map(|y| (0..4u8).flat_map(move |x| [x + 10 * y; 3]))
            .collect();
        let canvas = RgbView::new(&data, 4, 2).unwrap();
        let mut firsts = Vec::new();
        let n = cut_tiles(canvas, (2, 1), &mut Vec::new(), &mut |i, t| {
            firsts.push((i, t.data()[0], t.width(), t.height()));
        });
        assert_eq!(n.ok(), Some(4));
        assert_eq!(
            firsts,
            [(0, 0, 2, 1), (1, 2, 2, 1), (2, 10, 2, 1), (3, 12, 2, 1)]
        );
        let mut padded = Vec::new();
        pad_into(&[9; 6], (2, 1), (3, 2), 255, &mut padded);
        assert_eq!(
            padded,
            [9, 9, 9, 9, 9, 9, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        assert_eq!(with_global(1), 1);
        assert_eq!(with_global(6), 7);
        assert!(check_sides(0, 3).is_err() && check_sides(3, 3).is_ok());
    }

    #[test]
    fn bf16_frames_round_the_f32_ones() {
        let data: Vec<u8> = (0..=255u8).flat_map(|v| [v, 255 - v, v / 2]).collect();
        let image = RgbView::new(&data, 16, 16).unwrap();
        let p = crate::ClipProcessor {
            shortest_edge: 16,
            crop_size: (16, 16),
            norm: crate::Normalization::CLIP,
            patch_size: 4,
        };
        let opts = |dtype| PreprocessOptions {
            dtype,
            ..PreprocessOptions::default()
        };
        let mut scratch = Scratch::default();
        let f32s = p.preprocess_view(image, &opts(OutputDtype::F32), &mut scratch);
        let bf16s = p.preprocess_view(image, &opts(OutputDtype::Bf16), &mut scratch);
        let (Ok(f32s), Ok(bf16s)) = (f32s, bf16s) else {
            panic!("preprocess failed")
        };
        assert_eq!(f32s.shape, [3, 16, 16]);
        let rounded: Vec<bf16> = f32s
            .pixel_values
            .to_f32_vec()
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        assert_eq!(
            bf16s.pixel_values.as_bytes(),
            bytemuck::cast_slice::<bf16, u8>(&rounded)
        );
    }
}
