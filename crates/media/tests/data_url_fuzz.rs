//! The `data_url` fuzz target's body (`fuzz/fuzz_targets/data_url.rs`) as
//! an ordinary test over a deterministic mutated corpus, so CI runs it
//! without libFuzzer or a nightly toolchain: `decode_data_url` never
//! panics, refuses only with client errors, and accepts only images within
//! the size cap that sniff as their declared format.

use base64::Engine as _;
use iris_media::{decode_data_url, ImageFormat};

const MAX_BYTES: u64 = 4096;

use iris_testkit::Rng;

/// The fuzz target's check; whether `url` was accepted.
fn check(url: &str) -> bool {
    match decode_data_url(url, MAX_BYTES) {
        Ok((bytes, format)) => {
            assert!(bytes.len() as u64 <= MAX_BYTES);
            assert_eq!(ImageFormat::sniff(&bytes), Some(format));
            true
        }
        Err(e) => {
            assert!(e.is_client_error(), "{e:?} is not a client error");
            false
        }
    }
}

/// The fuzz target's body: the text as is and behind two prefixes.
fn target(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let a = check(&text);
    check(&format!("data:image/png;base64,{text}"));
    check(&format!("data:image/png,{text}"));
    a
}

/// Bytes that mean something in a data: URL, inserted by the mutations.
const PUNCTUATION: [&[u8]; 8] = [b"%", b"=", b";", b",", b"+", b"/", b" ", b"\t"];

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0";
const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";

fn seeds() -> Vec<String> {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    vec![
        format!("data:image/png;base64,{}", b64(PNG)),
        format!("DATA:Image/PNG;charset=utf-8;BASE64,{}", b64(PNG)),
        format!("data:image/gif;base64,{}", b64(GIF).replace('/', "%2F")),
        "data:image/png,%89PNG%0D%0A%1A%0A%00%00%00%0DIHDR%00%00%00%01".to_owned(),
        format!("  data:image/jpeg;base64, {} ", b64(PNG)),
        format!("data:image/png;base64,{}", "A".repeat(6000)),
    ]
}

#[test]
fn mutated_data_urls_never_panic() {
    let mut rng = Rng(0xda7a_0ff1_ce00_0001);
    let mut accepted = 0;
    for seed in seeds() {
        target(seed.as_bytes());
        for _ in 0..500 {
            let mut bytes = seed.clone().into_bytes();
            rng.mutate(&mut bytes, 6, &PUNCTUATION);
            accepted += usize::from(target(&bytes));
        }
    }
    assert!(accepted > 0, "some mutants must still decode");
    for _ in 0..2000 {
        let len = rng.below(64);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        target(&bytes);
    }
}
