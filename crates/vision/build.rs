//! Compiles the row-by-row JPEG decoding shim (`src/decode/jpeg_rows.c`)
//! against the libjpeg-turbo that `turbojpeg-sys` builds and links.

fn main() {
    let source = "src/decode/jpeg_rows.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=DEP_TURBOJPEG_INCLUDE");
    let mut build = cc::Build::new();
    build.file(source).warnings(true);
    // turbojpeg-sys (`links = "turbojpeg"`) exports its header directories,
    // comma-separated: jpeglib.h and the jconfig.h of the very build linked.
    if let Ok(dirs) = std::env::var("DEP_TURBOJPEG_INCLUDE") {
        for dir in dirs.split(',').filter(|d| !d.is_empty()) {
            build.include(dir);
        }
    }
    build.compile("iris_jpeg_rows");
}
