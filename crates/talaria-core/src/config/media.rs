//! `media:`: the cache of photos, voice notes and files users send.

use super::*;

/// `media:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MediaConfig {
    /// The largest file accepted, in bytes; a bigger one is refused and
    /// nothing of it is kept.
    pub max_bytes: u64,
    /// The longest side, in pixels, of an image handed to a model (larger
    /// ones are downscaled, which bounds what one photo costs in tokens).
    pub image_max_px: u32,
    /// Days a cached file is kept; 0 keeps files forever.
    pub retention_days: u64,
    /// Whether images are described in words for a model without vision.
    pub describe_images: bool,
}

impl Default for MediaConfig {
    fn default() -> MediaConfig {
        MediaConfig {
            max_bytes: 20 * 1024 * 1024,
            image_max_px: 1568,
            retention_days: 7,
            describe_images: false,
        }
    }
}
