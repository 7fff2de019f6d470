//! Images made ready for a model: sizes, formats, and what is refused.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{crc32, elf, jpeg, png, png_header};
use talaria_media::{MediaError, prepare_image};

fn file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn decode(bytes: &[u8]) -> image::DynamicImage {
    image::load_from_memory(bytes).unwrap()
}

#[test]
fn the_test_pngs_checksums_are_real_crc32() {
    assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
}

#[test]
fn a_large_photo_is_downscaled_to_the_longest_side() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "big.jpg", &jpeg(4000, 3000));
    let prepared = prepare_image(&path, 1568).unwrap();
    assert_eq!((prepared.width, prepared.height), (1568, 1176));
    assert_eq!(prepared.mime, "image/jpeg");
    let back = decode(&prepared.bytes);
    assert_eq!((back.width(), back.height()), (1568, 1176));
    assert_eq!(
        image::guess_format(&prepared.bytes).unwrap(),
        image::ImageFormat::Jpeg
    );

    // Portrait keeps its proportions too.
    let path = file(&dir, "tall.png", &png(600, 2000, false));
    let prepared = prepare_image(&path, 500).unwrap();
    assert_eq!((prepared.width, prepared.height), (150, 500));
    assert_eq!(prepared.mime, "image/jpeg");
}

#[test]
fn a_small_image_keeps_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "small.png", &png(320, 200, false));
    let prepared = prepare_image(&path, 1568).unwrap();
    assert_eq!((prepared.width, prepared.height), (320, 200));
    let back = decode(&prepared.bytes);
    assert_eq!((back.width(), back.height()), (320, 200));
}

#[test]
fn transparency_is_kept_as_png() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "sticker.png", &png(400, 300, true));
    let prepared = prepare_image(&path, 200).unwrap();
    assert_eq!(prepared.mime, "image/png");
    assert_eq!((prepared.width, prepared.height), (200, 150));
    let back = decode(&prepared.bytes).to_rgba8();
    assert_eq!(
        back.get_pixel(10, 75).0[3],
        0,
        "the left half stays see-through"
    );
    assert_eq!(back.get_pixel(190, 75).0[3], 255);
}

#[test]
fn an_executable_named_jpg_is_not_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "photo.jpg", &elf());
    let err = prepare_image(&path, 1568).unwrap_err();
    assert!(matches!(err, MediaError::NotAnImage { .. }), "{err:?}");
    let said = err.to_string();
    assert!(
        said.contains("not an image") && said.contains("application/x-executable"),
        "{said}"
    );
}

#[test]
fn a_truncated_image_is_reported_as_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let whole = png(300, 300, false);
    let path = file(&dir, "cut.png", &whole[..whole.len() / 2]);
    let err = prepare_image(&path, 1568).unwrap_err();
    assert!(matches!(err, MediaError::BadImage(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("the image is damaged or incomplete"),
        "{err}"
    );
}

#[test]
fn a_decompression_bomb_is_refused_from_its_header_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "bomb.png", &png_header(50_000, 50_000));
    let started = Instant::now();
    let err = prepare_image(&path, 1568).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            err,
            MediaError::ImageTooLarge {
                max_side: 16_384,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("the image is too large to open"),
        "{err}"
    );

    // Within the sides but beyond the memory bound: 16,000 × 16,000 RGBA
    // is a gigabyte decoded.
    let path = file(&dir, "wide.png", &png_header(16_000, 16_000));
    let err = prepare_image(&path, 1568).unwrap_err();
    assert!(matches!(err, MediaError::ImageTooLarge { .. }), "{err:?}");
}

#[test]
fn gif_and_webp_are_read_too() {
    let dir = tempfile::tempdir().unwrap();
    let img = image::RgbaImage::from_fn(300, 100, |x, _| {
        image::Rgba([(x % 256) as u8, 40, 200, 255])
    });
    for format in [image::ImageFormat::Gif, image::ImageFormat::WebP] {
        let mut bytes = std::io::Cursor::new(Vec::new());
        img.write_to(&mut bytes, format).unwrap();
        // Named wrongly on purpose: the bytes decide.
        let path = file(&dir, "picture.jpg", bytes.get_ref());
        let prepared = prepare_image(&path, 150).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert_eq!((prepared.width, prepared.height), (150, 50), "{format:?}");
        assert_eq!(prepared.mime, "image/jpeg", "{format:?}: opaque");
    }
}

#[test]
fn a_photo_taken_sideways_is_turned_upright() {
    use image::ImageEncoder;
    // Stored 400 × 200, left half red; its EXIF says "rotate 90° clockwise"
    // (orientation 6), as a phone held upright writes it.
    let img = image::RgbImage::from_fn(400, 200, |x, _| {
        if x < 200 {
            image::Rgb([255, 0, 0])
        } else {
            image::Rgb([0, 0, 255])
        }
    });
    let exif = [
        0x49, 0x49, 0x2a, 0x00, 0x08, 0x00, 0x00, 0x00, // little-endian TIFF, IFD at 8
        0x01, 0x00, // one entry
        0x12, 0x01, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00,
        0x00, // Orientation = 6
        0x00, 0x00, 0x00, 0x00, // no next IFD
    ];
    let mut bytes = Vec::new();
    let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90);
    encoder.set_exif_metadata(exif.to_vec()).unwrap();
    encoder
        .write_image(img.as_raw(), 400, 200, image::ExtendedColorType::Rgb8)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "upright.jpg", &bytes);
    let prepared = prepare_image(&path, 100).unwrap();
    assert_eq!((prepared.width, prepared.height), (50, 100));
    let back = decode(&prepared.bytes).to_rgb8();
    let top = back.get_pixel(25, 10).0;
    let bottom = back.get_pixel(25, 90).0;
    assert!(
        top[0] > 200 && top[2] < 60,
        "the red half is on top: {top:?}"
    );
    assert!(
        bottom[2] > 200 && bottom[0] < 60,
        "the blue half below: {bottom:?}"
    );
}
