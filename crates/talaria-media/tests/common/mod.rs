//! Helpers shared by the media tests: real files made on the spot.

#![allow(dead_code)]

use std::path::Path;

use image::{ImageBuffer, Rgb, Rgba};

/// The names in `dir`, sorted; empty when it does not exist.
pub fn listing(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A real PNG of `width` × `height`, a gradient so it is not trivially
/// compressible; with `alpha`, half of it is see-through.
pub fn png(width: u32, height: u32, alpha: bool) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    if alpha {
        let img = ImageBuffer::from_fn(width, height, |x, y| {
            Rgba([
                (x % 256) as u8,
                (y % 256) as u8,
                90,
                if x < width / 2 { 0 } else { 255 },
            ])
        });
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    } else {
        let img = ImageBuffer::from_fn(width, height, |x, y| {
            Rgb([(x % 256) as u8, (y % 256) as u8, 90])
        });
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    }
    out.into_inner()
}

/// A real JPEG of `width` × `height`.
pub fn jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = ImageBuffer::from_fn(width, height, |x, y| {
        Rgb([(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
    out.into_inner()
}

/// The start of a 64-bit Linux ELF executable: what a program renamed
/// `photo.jpg` begins with.
pub fn elf() -> Vec<u8> {
    let mut b = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    b.resize(16, 0);
    // e_type = ET_EXEC, e_machine = x86-64, e_version = 1.
    b.extend_from_slice(&[2, 0, 0x3e, 0, 1, 0, 0, 0]);
    b.resize(4096, 0x90);
    b
}

/// A PNG whose header claims `width` × `height` pixels, followed by a
/// tiny compressed stream: a decompression bomb's calling card. Every
/// chunk has a correct CRC, so only its size can get it refused.
pub fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    // 8-bit RGBA, deflate, adaptive filtering, no interlace.
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    chunk(&mut b, b"IHDR", &ihdr);
    // A zlib stream of an empty, unfinished deflate block.
    chunk(&mut b, b"IDAT", &[0x78, 0x9c, 0x00, 0x00, 0x00, 0xff, 0xff]);
    b
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (IEEE), bit by bit: PNG's chunk checksum.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
