//! Images made ready for a model: sizes, formats, and what is refused.

mod common;

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
