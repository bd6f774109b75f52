//! Compiles the row-by-row JPEG decoding shim (`src/decode/jpeg_rows.c`)
//! with its Huffman decoder and its chroma upsampling and colour
//! conversion (`jpeg_huffman.c`, `jpeg_color.c`) against the libjpeg-turbo
//! that `turbojpeg-sys` builds and links.

fn main() {
    let sources = [
        "src/decode/jpeg_rows.c",
        "src/decode/jpeg_huffman.c",
        "src/decode/jpeg_color.c",
    ];
    let headers = ["src/decode/jpeg_huffman.h", "src/decode/jpeg_color.h"];
    for file in sources.iter().chain(&headers) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=DEP_TURBOJPEG_INCLUDE");
    let mut build = cc::Build::new();
    build.files(sources).warnings(true);
    // turbojpeg-sys (`links = "turbojpeg"`) exports its header directories,
    // comma-separated: jpeglib.h and the jconfig.h of the very build linked.
    if let Ok(dirs) = std::env::var("DEP_TURBOJPEG_INCLUDE") {
        for dir in dirs.split(',').filter(|d| !d.is_empty()) {
            build.include(dir);
        }
    }
    build.compile("iris_jpeg_rows");
}
