//! Opening a container from bytes in memory: a custom `AVIOContext` whose
//! read and seek callbacks walk a borrowed slice, so libav never touches a
//! file, and the demuxer is chosen from the sniffed container instead of
//! libav's own probing.

use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr;

use ffmpeg_next::ffi;
use ffmpeg_next::format::context::Input;

use crate::container::Container;
use crate::error::VideoError;
use crate::libav::{corrupt, library};

/// Size of the buffer libav reads through (it may grow it).
const IO_BUFFER_SIZE: usize = 64 * 1024;

/// The slice behind the `AVIOContext` and the read position in it.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

/// `read_packet` callback: copies the next bytes of the slice into `buf`.
unsafe extern "C" fn read_packet(opaque: *mut c_void, buf: *mut u8, buf_size: c_int) -> c_int {
    // SAFETY: `opaque` is the `Reader` boxed in `MemoryInput`, which outlives
    // the AVIOContext; libav calls back from one thread at a time.
    let reader = unsafe { &mut *opaque.cast::<Reader>() };
    let remaining = &reader.data[reader.pos.min(reader.data.len())..];
    if remaining.is_empty() {
        return ffi::AVERROR_EOF;
    }
    let n = remaining.len().min(usize::try_from(buf_size).unwrap_or(0));
    // SAFETY: libav hands a writable buffer of `buf_size` bytes; n <= buf_size
    // and n <= remaining.len(), and the two never overlap.
    unsafe { ptr::copy_nonoverlapping(remaining.as_ptr(), buf, n) };
    reader.pos += n;
    // n <= buf_size, a c_int.
    n as c_int
}

/// `seek` callback: moves the read position (or reports the size).
unsafe extern "C" fn seek(opaque: *mut c_void, offset: i64, whence: c_int) -> i64 {
    // SAFETY: as in `read_packet`.
    let reader = unsafe { &mut *opaque.cast::<Reader>() };
    let len = reader.data.len() as i64;
    let whence = whence & !(ffi::AVSEEK_FORCE as c_int);
    let base = match whence {
        w if w == ffi::AVSEEK_SIZE as c_int => return len,
        0 => 0,                 // SEEK_SET
        1 => reader.pos as i64, // SEEK_CUR
        2 => len,               // SEEK_END
        _ => return i64::from(ffi::AVERROR(ffi::EINVAL)),
    };
    match base.checked_add(offset) {
        Some(pos) if (0..=len).contains(&pos) => {
            reader.pos = pos as usize;
            pos
        }
        _ => i64::from(ffi::AVERROR(ffi::EINVAL)),
    }
}

/// Owns the `AVIOContext` and its buffer (libav never frees a custom one).
struct AvioGuard(*mut ffi::AVIOContext);

impl Drop for AvioGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from avio_alloc_context and is freed only
        // here; the format context that used it is closed before (field order
        // of MemoryInput). The buffer may have been reallocated by libav, so
        // free the one the context holds now.
        unsafe {
            ffi::av_freep(ptr::addr_of_mut!((*self.0).buffer).cast());
            ffi::avio_context_free(&mut self.0);
        }
    }
}

/// A demuxer reading `bytes` in memory. Fields drop in order: the format
/// context, then its I/O context, then the reader they point to.
pub(crate) struct MemoryInput<'a> {
    input: Input,
    _io: AvioGuard,
    _reader: Box<Reader<'a>>,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> MemoryInput<'a> {
    /// Opens `bytes` with the demuxer of `container` and reads the stream
    /// parameters (`avformat_find_stream_info`, as PyAV's `av.open` does).
    pub(crate) fn open(bytes: &'a [u8], container: Container) -> Result<Self, VideoError> {
        let mut reader = Box::new(Reader {
            data: bytes,
            pos: 0,
        });
        let io = alloc_io(&mut reader)?;
        let demuxer = find_demuxer(container)?;
        // SAFETY: allocates an empty context; checked for null below.
        let mut ctx = unsafe { ffi::avformat_alloc_context() };
        if ctx.is_null() {
            return Err(library("cannot allocate a format context"));
        }
        // SAFETY: ctx is valid; setting pb before opening marks the I/O as
        // custom, so avformat_close_input leaves it to AvioGuard. On failure
        // avformat_open_input frees ctx itself.
        let ret = unsafe {
            (*ctx).pb = io.0;
            ffi::avformat_open_input(&mut ctx, ptr::null(), demuxer, ptr::null_mut())
        };
        if ret < 0 {
            return Err(corrupt(container, "opening the container", ret));
        }
        // SAFETY: ctx is an opened input context; Input closes it on drop.
        let mut input = unsafe { Input::wrap(ctx) };
        // SAFETY: the context is open; no options are passed.
        let ret = unsafe { ffi::avformat_find_stream_info(input.as_mut_ptr(), ptr::null_mut()) };
        if ret < 0 {
            return Err(corrupt(container, "reading the stream parameters", ret));
        }
        Ok(MemoryInput {
            input,
            _io: io,
            _reader: reader,
            _bytes: PhantomData,
        })
    }

    pub(crate) fn input(&mut self) -> &mut Input {
        &mut self.input
    }
}

/// The read-only `AVIOContext` over `reader`.
fn alloc_io(reader: &mut Box<Reader<'_>>) -> Result<AvioGuard, VideoError> {
    // SAFETY: plain allocation, checked for null.
    let buffer = unsafe { ffi::av_malloc(IO_BUFFER_SIZE) }.cast::<u8>();
    if buffer.is_null() {
        return Err(library("cannot allocate the I/O buffer"));
    }
    let opaque: *mut Reader = &mut **reader;
    // SAFETY: buffer is IO_BUFFER_SIZE bytes from av_malloc, owned by the
    // context from here on; opaque stays valid as long as the Box it points
    // into (kept in MemoryInput after the format context).
    let io = unsafe {
        ffi::avio_alloc_context(
            buffer,
            IO_BUFFER_SIZE as c_int,
            0,
            opaque.cast(),
            Some(read_packet),
            None,
            Some(seek),
        )
    };
    if io.is_null() {
        // SAFETY: the context was not created, so the buffer is still ours.
        unsafe { ffi::av_free(buffer.cast()) };
        return Err(library("cannot allocate the I/O context"));
    }
    Ok(AvioGuard(io))
}

/// libav's demuxer for `container`.
fn find_demuxer(container: Container) -> Result<*const ffi::AVInputFormat, VideoError> {
    let name: &CStr = match container {
        Container::Mp4 => c"mov",
        Container::Matroska => c"matroska",
        Container::Gif | Container::WebP => return Err(VideoError::UnsupportedContainer),
    };
    // SAFETY: name is a NUL-terminated string; the result is static or null.
    let demuxer = unsafe { ffi::av_find_input_format(name.as_ptr()) };
    if demuxer.is_null() {
        return Err(VideoError::UnsupportedContainer);
    }
    Ok(demuxer)
}
