//! An image made ready for a model: decoded within bounds, downscaled,
//! re-encoded.
//!
//! A photo from a phone is 12 to 50 megapixels; a model sees at most
//! about 1.5 megapixels of it and bills tokens by the pixel. Downscaling
//! here bounds both what a request carries and what it costs. Decoding is
//! the dangerous part: an image file states its own dimensions, and a
//! few kilobytes of PNG may claim 50,000 × 50,000 pixels (ten gigabytes
//! decoded). The decoder is given limits, so such a file is refused from
//! its header, before any buffer of that size exists.

use std::io::Read;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{DynamicImage, ImageDecoder, ImageEncoder, ImageError, ImageReader, Limits};

use crate::MediaError;
use crate::sniff::{SNIFF_BYTES, sniff};

/// The longest side decoded, in pixels: more than any camera takes.
pub const MAX_SIDE: u32 = 16_384;

/// The most memory a decoded image may take: a 50-megapixel photo fits.
pub const MAX_DECODED: u64 = 256 * 1024 * 1024;

/// JPEG quality of a prepared photo: no visible loss at model resolution.
const JPEG_QUALITY: u8 = 85;

/// An image as it is sent to a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    /// The encoded image.
    pub bytes: Vec<u8>,
    /// `image/jpeg`, or `image/png` when the image has transparency.
    pub mime: &'static str,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Decodes the image at `path` (JPEG, PNG, GIF's first frame or WebP),
/// turns it upright as its EXIF orientation says, downscales it so that
/// its longest side is at most `max_px` (keeping its proportions; a
/// smaller image keeps its size) and re-encodes it: JPEG, or PNG when it
/// has transparency.
///
/// The type is read from the file's bytes, whatever its name says. This
/// is CPU work of tens of milliseconds: call it from
/// `tokio::task::spawn_blocking` in async code.
pub fn prepare_image(path: &Path, max_px: u32) -> Result<PreparedImage, MediaError> {
    let what = sniff_file(path)?;
    if what.kind != crate::MediaKind::Image {
        return Err(MediaError::NotAnImage {
            what: what.mime.to_owned(),
        });
    }
    let mut reader = ImageReader::open(path)
        .and_then(ImageReader::with_guessed_format)
        .map_err(|e| read_error(path, e))?;
    if reader.format().is_none() {
        return Err(MediaError::NotAnImage {
            what: what.mime.to_owned(),
        });
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODED);
    reader.limits(limits);

    // The limits are checked against the header's dimensions here, before
    // any pixel is decoded.
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| decode_error(e, what.mime))?;
    // The decoder checks the sides; the memory the pixels take is checked
    // here, as decoding straight from a decoder does not.
    if decoder.total_bytes() > MAX_DECODED {
        return Err(too_large());
    }
    let orientation = decoder
        .orientation()
        .map_err(|e| decode_error(e, what.mime))?;
    let image = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(e, what.mime))?;

    let (width, height) = fit(image.width(), image.height(), max_px.max(1));
    // `thumbnail_exact` averages areas of pixels: right for shrinking,
    // and without the full-size float buffer a filtered resize needs.
    let mut image = if (width, height) == (image.width(), image.height()) {
        image
    } else {
        image.thumbnail_exact(width, height)
    };
    // Turned after shrinking, so the rotation copies the small image.
    image.apply_orientation(orientation);
    encode(&image)
}

/// `(width, height)` scaled so the longer side is at most `max`, rounded
/// to the nearest pixel and never below 1; unchanged when it fits.
fn fit(width: u32, height: u32, max: u32) -> (u32, u32) {
    let longest = width.max(height);
    if longest <= max {
        return (width, height);
    }
    let scale = |side: u32| {
        let scaled =
            (u64::from(side) * u64::from(max) + u64::from(longest) / 2) / u64::from(longest);
        // At most `max`, so it fits in a u32.
        u32::try_from(scaled.max(1)).unwrap_or(max)
    };
    (scale(width), scale(height))
}

/// JPEG for what is opaque, PNG for what is not (JPEG has no alpha, and
/// flattening would put a black or white box around a sticker).
fn encode(image: &DynamicImage) -> Result<PreparedImage, MediaError> {
    let (width, height) = (image.width(), image.height());
    let mut bytes = Vec::new();
    let encoded = if has_transparency(image) {
        let rgba = image.to_rgba8();
        PngEncoder::new(&mut bytes)
            .write_image(
                rgba.as_raw(),
                width,
                height,
                image::ExtendedColorType::Rgba8,
            )
            .map(|()| "image/png")
    } else {
        let rgb = image.to_rgb8();
        JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
            .write_image(rgb.as_raw(), width, height, image::ExtendedColorType::Rgb8)
            .map(|()| "image/jpeg")
    };
    let mime = encoded.map_err(|e| MediaError::Encode(e.to_string()))?;
    Ok(PreparedImage {
        bytes,
        mime,
        width,
        height,
    })
}

/// Whether any pixel is less than fully opaque (an alpha channel alone
/// says nothing: many opaque PNGs have one).
fn has_transparency(image: &DynamicImage) -> bool {
    image.color().has_alpha() && image.to_rgba8().pixels().any(|p| p.0[3] != u8::MAX)
}

/// What the file's first bytes say it is.
fn sniff_file(path: &Path) -> Result<crate::sniff::Sniffed, MediaError> {
    Ok(sniff(&head_of(path)?, false))
}

/// What a file on disk is, from its first bytes: its MIME type and kind.
/// An OGG/Opus file counts as a voice note here, since that is what the
/// platforms show as one when it is sent.
pub fn identify(path: &Path) -> Result<(&'static str, crate::MediaKind), MediaError> {
    let found = sniff(&head_of(path)?, true);
    Ok((found.mime, found.kind))
}

/// The first [`SNIFF_BYTES`] of a file (all of a shorter one).
fn head_of(path: &Path) -> Result<Vec<u8>, MediaError> {
    let file = std::fs::File::open(path).map_err(|e| read_error(path, e))?;
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    file.take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| read_error(path, e))?;
    Ok(head)
}

fn read_error(path: &Path, source: std::io::Error) -> MediaError {
    MediaError::Cache {
        path: path.to_owned(),
        source,
    }
}

fn too_large() -> MediaError {
    MediaError::ImageTooLarge {
        max_side: MAX_SIDE,
        max_decoded: MAX_DECODED,
    }
}

/// The decoder's error in the user's words.
fn decode_error(e: ImageError, mime: &str) -> MediaError {
    match e {
        ImageError::Limits(_) => too_large(),
        ImageError::Unsupported(_) => MediaError::NotAnImage {
            what: mime.to_owned(),
        },
        other => MediaError::BadImage(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitting_keeps_proportions_and_never_enlarges() {
        assert_eq!(fit(4000, 3000, 1568), (1568, 1176));
        assert_eq!(fit(3000, 4000, 1568), (1176, 1568));
        assert_eq!(fit(800, 600, 1568), (800, 600));
        assert_eq!(fit(1568, 10, 1568), (1568, 10));
        // A sliver keeps at least one pixel.
        assert_eq!(fit(16_000, 2, 100), (100, 1));
    }
}
