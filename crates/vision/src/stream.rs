//! Streaming (non-temporal) copies into the large output tensors.
//!
//! A Qwen output tensor (50 MB for a 1080p photo) is far larger than the
//! caches and is read next by another thread (the encoder's sender). Plain
//! stores first read every line they write (read-for-ownership), doubling
//! the memory traffic; streaming stores write whole lines straight to memory.
//! Rows are assembled in a small cache-resident buffer and then streamed out
//! in order, so every written line is filled completely.
//!
//! Streaming stores are weakly ordered: call [`fence`] after the last one,
//! before the buffer can be observed by another thread.

/// Copies `src` into `dst` (same length), with streaming stores (32 bytes
/// wide with AVX) where the destination is aligned and plain stores for the
/// unaligned ends.
#[inline]
pub(crate) fn copy<T: bytemuck::Pod>(dst: &mut [T], src: &[T]) {
    copy_bytes(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream::copy length mismatch");
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let (dst_head, dst_rest) = dst.split_at_mut(head);
    let (src_head, src_rest) = src.split_at(head);
    dst_head.copy_from_slice(src_head);
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX (checked just above).
        unsafe { stream_avx(dst_rest, src_rest) };
    } else {
        stream_sse2(dst_rest, src_rest);
    }
}

/// Streams `src` into `dst` (16-byte aligned start) 32 bytes at a time once
/// 32-byte aligned, finishing with [`stream_sse2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn stream_avx(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    let lead = if dst.as_ptr().align_offset(32) == 0 {
        0
    } else {
        16.min(dst.len())
    };
    let (dst_lead, dst_rest) = dst.split_at_mut(lead);
    let (src_lead, src_rest) = src.split_at(lead);
    stream_sse2(dst_lead, src_lead);
    let (dst_body, dst_tail) = dst_rest.as_chunks_mut::<32>();
    let (src_body, src_tail) = src_rest.as_chunks::<32>();
    for (d, s) in dst_body.iter_mut().zip(src_body) {
        // SAFETY: AVX is enabled for this function. `s` is 32 readable
        // bytes (unaligned load); `d` is 32 writable bytes at a 32-byte
        // aligned address: `dst` starts 16-byte aligned, `lead` (0 or 16)
        // reaches 32-byte alignment, and every chunk is 32 bytes long.
        unsafe {
            let v = _mm256_loadu_si256(s.as_ptr().cast::<__m256i>());
            _mm256_stream_si256(d.as_mut_ptr().cast::<__m256i>(), v);
        }
    }
    stream_sse2(dst_tail, src_tail);
}

/// Streams `src` into `dst` (16-byte aligned start) 16 bytes at a time; a
/// tail shorter than 16 bytes is copied with plain stores.
#[cfg(target_arch = "x86_64")]
#[inline]
fn stream_sse2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let (dst_body, dst_tail) = dst.as_chunks_mut::<16>();
    let (src_body, src_tail) = src.as_chunks::<16>();
    for (d, s) in dst_body.iter_mut().zip(src_body) {
        // SAFETY: SSE2 is part of the x86_64 baseline. `s` is 16 readable
        // bytes (unaligned load); `d` is 16 writable bytes whose address is
        // 16-byte aligned, because `dst` starts aligned (callers) and every
        // chunk is 16 bytes long.
        unsafe {
            let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
        }
    }
    dst_tail.copy_from_slice(src_tail);
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// Orders all earlier streaming stores of this thread before later stores.
#[inline]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline; a fence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_alignment_and_length() {
        let src: Vec<u8> = (0..200u8).collect();
        // Offsets up to 48 reach every alignment modulo 32.
        for offset in 0..48 {
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 100, 183] {
                let mut dst = vec![0xAAu8; 200 + 48];
                copy(&mut dst[offset..offset + len], &src[..len]);
                fence();
                assert_eq!(&dst[offset..offset + len], &src[..len]);
                assert!(dst[..offset].iter().all(|&b| b == 0xAA));
                assert!(dst[offset + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }

    #[test]
    fn copies_floats() {
        let src: Vec<f32> = (0..1176).map(|i| i as f32 * 0.5).collect();
        let mut dst = vec![0f32; 1176];
        copy(&mut dst, &src);
        fence();
        assert_eq!(dst, src);
    }
}
