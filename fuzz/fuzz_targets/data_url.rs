//! Fuzz target: arbitrary text through `iris_media::decode_data_url`, as
//! given and behind `data:image/png;base64,` / `data:image/png,` prefixes.
//! Any panic is a bug; an error must be a client error (400), and an
//! accepted image must be within the size cap and sniff as its format.
#![no_main]

use iris_media::{decode_data_url, ImageFormat};
use libfuzzer_sys::fuzz_target;

const MAX_BYTES: u64 = 4096;

fn check(url: &str) {
    match decode_data_url(url, MAX_BYTES) {
        Ok((bytes, format)) => {
            assert!(bytes.len() as u64 <= MAX_BYTES);
            assert_eq!(ImageFormat::sniff(&bytes), Some(format));
        }
        Err(e) => assert!(e.is_client_error(), "{e:?} is not a client error"),
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check(&text);
    check(&format!("data:image/png;base64,{text}"));
    check(&format!("data:image/png,{text}"));
});
