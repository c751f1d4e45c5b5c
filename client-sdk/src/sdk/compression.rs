//! Payload compression in Pulsar's exact formats: LZ4 as a raw block (no
//! frame), ZLIB as a zlib stream, ZSTD as a zstd frame, SNAPPY as a raw
//! snappy block. The metadata's `uncompressed_size` bounds decompression;
//! a corrupt payload or a size over [`UNCOMPRESSED_MAX`] is an error.

use std::io::{Read, Write};

use super::error::{Error, Result};
use crate::proto::pulsar::CompressionType;

/// Largest uncompressed payload accepted (a batch of maximum-size messages).
pub const UNCOMPRESSED_MAX: usize = 64 * 1024 * 1024;

/// Compresses `data` with `kind`.
pub fn compress(kind: CompressionType, data: &[u8]) -> Result<Vec<u8>> {
    let err = |e: &dyn std::fmt::Display| Error::Payload(format!("{kind:?} compression: {e}"));
    match kind {
        CompressionType::None => Ok(data.to_vec()),
        CompressionType::Lz4 => Ok(lz4_flex::block::compress(data)),
        CompressionType::Zlib => {
            let mut enc =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data).map_err(|e| err(&e))?;
            enc.finish().map_err(|e| err(&e))
        }
        CompressionType::Zstd => zstd::bulk::compress(data, 3).map_err(|e| err(&e)),
        CompressionType::Snappy => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| err(&e)),
    }
}

/// Decompresses `data` (`kind` from the metadata) to exactly
/// `uncompressed_size` bytes.
pub fn decompress(kind: CompressionType, data: &[u8], uncompressed_size: usize) -> Result<Vec<u8>> {
    if kind == CompressionType::None {
        return Ok(data.to_vec());
    }
    if uncompressed_size > UNCOMPRESSED_MAX {
        return Err(Error::Payload(format!(
            "uncompressed size {uncompressed_size} exceeds {UNCOMPRESSED_MAX}"
        )));
    }
    let err = |e: &dyn std::fmt::Display| Error::Payload(format!("{kind:?} decompression: {e}"));
    let out = match kind {
        CompressionType::None => data.to_vec(),
        CompressionType::Lz4 => {
            lz4_flex::block::decompress(data, uncompressed_size).map_err(|e| err(&e))?
        }
        CompressionType::Zlib => {
            let mut out = Vec::with_capacity(uncompressed_size);
            flate2::read::ZlibDecoder::new(data)
                .take(uncompressed_size as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| err(&e))?;
            out
        }
        CompressionType::Zstd => {
            zstd::bulk::decompress(data, uncompressed_size).map_err(|e| err(&e))?
        }
        CompressionType::Snappy => {
            let len = snap::raw::decompress_len(data).map_err(|e| err(&e))?;
            if len != uncompressed_size {
                return Err(Error::Payload(format!(
                    "snappy length {len} differs from uncompressed_size {uncompressed_size}"
                )));
            }
            snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| err(&e))?
        }
    };
    if out.len() != uncompressed_size {
        return Err(Error::Payload(format!(
            "{kind:?}: decompressed {} bytes, metadata says {uncompressed_size}",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [CompressionType; 5] = [
        CompressionType::None,
        CompressionType::Lz4,
        CompressionType::Zlib,
        CompressionType::Zstd,
        CompressionType::Snappy,
    ];

    #[test]
    fn round_trips_every_kind() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 97).to_be_bytes())
            .collect();
        for kind in KINDS {
            let c = compress(kind, &data).unwrap();
            if kind != CompressionType::None {
                assert!(c.len() < data.len(), "{kind:?} compresses");
            }
            assert_eq!(decompress(kind, &c, data.len()).unwrap(), data, "{kind:?}");
        }
    }

    #[test]
    fn corrupt_or_wrong_size_is_an_error() {
        let data = b"hello hello hello hello hello hello".repeat(10);
        for kind in &KINDS[1..] {
            let c = compress(*kind, &data).unwrap();
            assert!(
                decompress(*kind, &c, data.len() + 1).is_err(),
                "{kind:?} size"
            );
            assert!(
                decompress(*kind, &[0xff, 0x13, 0x00, 0x42], data.len()).is_err(),
                "{kind:?} garbage"
            );
        }
        assert!(decompress(CompressionType::Lz4, &[], UNCOMPRESSED_MAX + 1).is_err());
    }

    #[test]
    fn known_vectors() {
        // zlib stream header (deflate, default level) and the zstd frame magic.
        assert_eq!(
            &compress(CompressionType::Zlib, b"x").unwrap()[..2],
            &[0x78, 0x9c]
        );
        assert_eq!(
            &compress(CompressionType::Zstd, b"x").unwrap()[..4],
            &[0x28, 0xb5, 0x2f, 0xfd]
        );
        // Raw snappy: varint length then a literal.
        assert_eq!(
            compress(CompressionType::Snappy, b"abc").unwrap(),
            vec![3, 8, b'a', b'b', b'c']
        );
        // Raw LZ4 block: a single literal-only sequence.
        assert_eq!(
            compress(CompressionType::Lz4, b"abc").unwrap(),
            vec![0x30, b'a', b'b', b'c']
        );
    }
}
