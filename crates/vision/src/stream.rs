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

/// Copies `src` into `dst` (same length), with streaming stores where the
/// destination is 16-byte aligned and plain stores for the unaligned ends.
#[inline]
pub(crate) fn copy<T: bytemuck::Pod>(dst: &mut [T], src: &[T]) {
    copy_bytes(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    assert_eq!(dst.len(), src.len(), "stream::copy length mismatch");
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let (dst_head, dst_rest) = dst.split_at_mut(head);
    let (src_head, src_rest) = src.split_at(head);
    dst_head.copy_from_slice(src_head);
    let (dst_body, dst_tail) = dst_rest.as_chunks_mut::<16>();
    let (src_body, src_tail) = src_rest.as_chunks::<16>();
    for (d, s) in dst_body.iter_mut().zip(src_body) {
        // SAFETY: SSE2 is part of the x86_64 baseline. `s` is 16 readable
        // bytes (unaligned load); `d` is 16 writable bytes whose address is
        // 16-byte aligned, because `dst_rest` starts at an aligned address
        // (`head` above) and every chunk is 16 bytes long.
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
        for offset in 0..16 {
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 183] {
                let mut dst = vec![0xAAu8; 200 + 16];
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
