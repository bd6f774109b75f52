//! The two separable resampling passes over packed RGB8 rows.
//!
//! Both passes accumulate `u8 × i32` products in `i32`, which is exact, so
//! any summation order gives Pillow's numbers. That freedom is what makes
//! them vectorise:
//! - the vertical pass walks a block of bytes across a row, one tap row at a
//!   time (plain lane-parallel multiply-add);
//! - the horizontal pass first transposes a strip of `STRIP_ROWS` rows so
//!   that the same column of every row lies contiguous, then runs the same
//!   lane-parallel multiply-add with one lane per (row, channel); with AVX2
//!   the transposes run in vector registers ([`super::strip`]) and the body
//!   here is the portable fallback.
//!
//! The inner loops are compiled twice, for the baseline target and for AVX2
//! (chosen at run time), from one generic body.

use super::hblock::BlockKernel;
use super::kernel::{clip8, Kernel, BIAS};
use rayon::prelude::*;
use std::cell::Cell;

/// Rows transposed together by the horizontal pass.
pub(crate) const STRIP_ROWS: usize = super::strip::ROWS;
const STRIP_LANES: usize = super::strip::LANES;
/// Rows per parallel task of the blocked horizontal pass.
const BLOCK_TASK_ROWS: usize = 32;
/// Bytes of a row accumulated together by the vertical pass.
const BLOCK: usize = 64;

thread_local! {
    /// Per-thread transpose buffer of the horizontal pass (recycled).
    static STRIP: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Horizontal pass: `src` holds `rows` rows of `in_w` pixels; `dst` receives
/// `rows` rows of `kernel.out_size()` pixels.
pub(crate) fn horizontal(src: &[u8], in_w: usize, kernel: &Kernel, dst: &mut [u8], parallel: bool) {
    let out_row = kernel.out_size() * 3;
    let in_row = in_w * 3;
    if let Some(blocks) = blocked(kernel) {
        let task = |(i, dst_rows): (usize, &mut [u8])| {
            let rows = dst_rows.len() / out_row;
            let src_rows = &src[i * BLOCK_TASK_ROWS * in_row..][..rows * in_row];
            blocks.rows(kernel, src_rows, dst_rows);
        };
        let chunk = BLOCK_TASK_ROWS * out_row;
        if parallel {
            dst.par_chunks_mut(chunk).enumerate().for_each(task);
        } else {
            dst.chunks_mut(chunk).enumerate().for_each(task);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = super::madd::Simd::best() {
        strips(simd, (src, in_w), vec![(kernel, dst)], parallel);
        return;
    }
    let strip = |(i, dst_strip): (usize, &mut [u8])| {
        let rows = dst_strip.len() / out_row;
        let src_strip = &src[i * STRIP_ROWS * in_row..][..rows * in_row];
        with_strip_buffer(super::strip::buffer_len(in_w, kernel.out_size()), |tmp| {
            horizontal_strip_body(src_strip, in_w, rows, kernel, tmp, dst_strip)
        });
    };
    let chunk = STRIP_ROWS * out_row;
    if parallel {
        dst.par_chunks_mut(chunk).enumerate().for_each(strip);
    } else {
        dst.chunks_mut(chunk).enumerate().for_each(strip);
    }
}

/// [`horizontal`] by each of `kernels` into its `dsts` entry: the
/// kernels that take the transposing pass share each strip's transpose
/// ([`super::strip::strip`]); the others run one by one.
pub(crate) fn horizontal_many(
    src: &[u8],
    in_w: usize,
    kernels: &[&Kernel],
    dsts: &mut [&mut [u8]],
    parallel: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = super::madd::Simd::best() {
        let mut shared: Vec<(&Kernel, &mut [u8])> = Vec::new();
        for (&kernel, dst) in kernels.iter().zip(dsts.iter_mut()) {
            match blocked(kernel) {
                Some(_) => horizontal(src, in_w, kernel, dst, parallel),
                None => shared.push((kernel, dst)),
            }
        }
        if !shared.is_empty() {
            strips(simd, (src, in_w), shared, parallel);
        }
        return;
    }
    for (&kernel, dst) in kernels.iter().zip(dsts.iter_mut()) {
        horizontal(src, in_w, kernel, dst, parallel);
    }
}

/// The blocked form of `kernel` when the blocked pass takes it (the scale
/// suits it and the CPU has its vector body).
fn blocked(kernel: &Kernel) -> Option<&BlockKernel> {
    kernel.blocks().filter(|_| has_avx2())
}

/// The transposing pass over the strips of `src` by every kernel of
/// `kernels` at once (each into its own output), a strip per task.
#[cfg(target_arch = "x86_64")]
fn strips(
    simd: super::madd::Simd,
    (src, in_w): (&[u8], usize),
    kernels: Vec<(&Kernel, &mut [u8])>,
    parallel: bool,
) {
    let in_row = in_w * 3;
    let (kernels, dsts): (Vec<&Kernel>, Vec<&mut [u8]>) = kernels.into_iter().unzip();
    let widest = kernels.iter().map(|k| k.out_size()).max().unwrap_or(0);
    // tasks[i]: strip i of every output.
    let mut tasks: Vec<Vec<&mut [u8]>> = Vec::new();
    for (kernel, dst) in kernels.iter().zip(dsts) {
        let chunks = dst.chunks_mut(STRIP_ROWS * kernel.out_size() * 3);
        for (i, chunk) in chunks.enumerate() {
            match tasks.get_mut(i) {
                Some(task) => task.push(chunk),
                None => tasks.push(vec![chunk]),
            }
        }
    }
    let task = |(i, mut dst_strips): (usize, Vec<&mut [u8]>)| {
        let rows = (src.len() / in_row - i * STRIP_ROWS).min(STRIP_ROWS);
        let src_strip = &src[i * STRIP_ROWS * in_row..][..rows * in_row];
        with_strip_buffer(super::strip::buffer_len(in_w, widest), |tmp| {
            super::strip::strip(
                simd,
                (src_strip, in_w, rows),
                &kernels,
                tmp,
                &mut dst_strips,
            )
        });
    };
    if parallel {
        tasks.into_par_iter().enumerate().for_each(task);
    } else {
        tasks.into_iter().enumerate().for_each(task);
    }
}

/// Vertical pass: `src` holds rows of `row_len` bytes; `dst` receives
/// `kernel.out_size()` rows.
pub(crate) fn vertical(
    src: &[u8],
    row_len: usize,
    kernel: &Kernel,
    dst: &mut [u8],
    parallel: bool,
) {
    let rows_per_task = (256 * 1024 / row_len.max(1)).max(1);
    let task = |(i, dst_rows): (usize, &mut [u8])| {
        for (j, out) in dst_rows.chunks_exact_mut(row_len).enumerate() {
            let (start, weights) = kernel.taps(i * rows_per_task + j);
            vertical_row(&src[start * row_len..], row_len, weights, out);
        }
    };
    let chunk = rows_per_task * row_len;
    if parallel {
        dst.par_chunks_mut(chunk).enumerate().for_each(task);
    } else {
        dst.chunks_mut(chunk).enumerate().for_each(task);
    }
}

/// Whether the blocked horizontal pass has its vector body on this CPU.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Output rows `first ..` of the vertical pass, as many as fit in `dst`:
/// `src` holds input rows `base ..` (every row they read), `row_len` bytes
/// each.
pub(crate) fn vertical_rows(
    (src, base): (&[u8], usize),
    row_len: usize,
    kernel: &Kernel,
    first: usize,
    dst: &mut [u8],
) {
    for (j, out) in dst.chunks_exact_mut(row_len).enumerate() {
        let (start, weights) = kernel.taps(first + j);
        vertical_row(&src[(start - base) * row_len..], row_len, weights, out);
    }
}

/// Lends this thread's transpose buffer, sized to `len` bytes.
fn with_strip_buffer(len: usize, f: impl FnOnce(&mut [u8])) {
    with_thread_buffer(&STRIP, len, f);
}

/// Lends the per-thread buffer in `slot`, grown to at least `len` bytes
/// (kept for the next call; its old contents are not cleared).
pub(crate) fn with_thread_buffer<R>(
    slot: &'static std::thread::LocalKey<Cell<Vec<u8>>>,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> R {
    slot.with(|cell| {
        let mut buf = cell.take();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let result = f(&mut buf[..len]);
        cell.set(buf);
        result
    })
}

fn vertical_row(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) =
        super::madd::Simd::best().filter(|_| weights.len() <= super::vmadd::MAX_TAPS)
    {
        super::vmadd::row(simd, src, row_len, weights, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { vertical_row_avx2(src, row_len, weights, out) };
        return;
    }
    vertical_row_body(src, row_len, weights, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn vertical_row_avx2(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    vertical_row_body(src, row_len, weights, out);
}

/// Transposes `rows` (≤ `STRIP_ROWS`) rows into column-major lanes, then
/// filters every output column with all lanes at once.
#[inline(always)]
fn horizontal_strip_body(
    src: &[u8],
    in_w: usize,
    rows: usize,
    kernel: &Kernel,
    tmp: &mut [u8],
    dst: &mut [u8],
) {
    let in_row = in_w * 3;
    let (columns, _) = tmp.as_chunks_mut::<STRIP_LANES>();
    for (r, row) in src.chunks_exact(in_row).take(rows).enumerate() {
        for (column, px) in columns.iter_mut().zip(row.chunks_exact(3)) {
            column[r * 3..r * 3 + 3].copy_from_slice(px);
        }
    }
    let out_row = kernel.out_size() * 3;
    for x in 0..kernel.out_size() {
        let (start, weights) = kernel.taps(x);
        let mut acc = [BIAS; STRIP_LANES];
        for (column, &w) in columns[start..start + weights.len()].iter().zip(weights) {
            for (a, &v) in acc.iter_mut().zip(column.iter()) {
                *a += i32::from(v) * w;
            }
        }
        for r in 0..rows {
            let out = &mut dst[r * out_row + x * 3..r * out_row + x * 3 + 3];
            for (o, &a) in out.iter_mut().zip(&acc[r * 3..r * 3 + 3]) {
                *o = clip8(a);
            }
        }
    }
}

/// One output row of the vertical pass: `src` starts at the first tap row.
#[inline(always)]
fn vertical_row_body(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    let (blocks, tail) = out.as_chunks_mut::<BLOCK>();
    for (b, block) in blocks.iter_mut().enumerate() {
        let mut acc = [BIAS; BLOCK];
        for (j, &w) in weights.iter().enumerate() {
            let (row, _) = src[j * row_len + b * BLOCK..][..BLOCK].as_chunks::<BLOCK>();
            for (a, &v) in acc.iter_mut().zip(row[0].iter()) {
                *a += i32::from(v) * w;
            }
        }
        for (o, &a) in block.iter_mut().zip(acc.iter()) {
            *o = clip8(a);
        }
    }
    let tail_start = blocks.len() * BLOCK;
    for (k, o) in tail.iter_mut().enumerate() {
        let mut acc = BIAS;
        for (j, &w) in weights.iter().enumerate() {
            acc += i32::from(src[j * row_len + tail_start + k]) * w;
        }
        *o = clip8(acc);
    }
}
