//! Fuzz target for the bookie journal's on-disk parsers
//! (`cms_bookie_format::journal`): the replay's scan of one file
//! (`scan_file`: torn tail vs corruption), single records (`decode_at`), the
//! file header and the checkpoint file.
//!
//! Input: byte 0 = flags (bit 0: a successor file names an end), bytes 1..9
//! = that end, the rest = the file's bytes (its generation is taken from the
//! first record position so CRC-valid records can be reached). For any
//! input: nothing panics; the scan's end lies within the file and at or after
//! its start; every record handed out re-encodes to the bytes it came from.

#![no_main]

use cms_bookie_format::journal::{
    FileHeader, decode_at, decode_checkpoint, encode_into, record_len, scan_file,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_checkpoint(data);
    let _ = FileHeader::decode(data);
    let Some((head, file)) = data.split_first_chunk::<9>() else {
        return;
    };
    let successor_end =
        (head[0] & 1 == 1).then(|| u64::from_be_bytes(head[1..9].try_into().unwrap_or_default()));
    // A record's generation sits at bytes 8..16: use the first record's, so
    // a scan gets past the generation check.
    let generation = file
        .get(8..16)
        .map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or_default()));

    // Every record decoded in place re-encodes to the same bytes.
    for pos in [0, 1, 512] {
        if let Ok(d) = decode_at(file, pos, generation) {
            assert_eq!(d.len, record_len(&d.record));
            let mut again = Vec::new();
            encode_into(&mut again, &d.record, generation, d.synced_offset);
            if d.last_in_group {
                cms_bookie_format::journal::mark_last_in_group(&mut again, 0);
            }
            assert_eq!(
                &again[..],
                &file[pos..pos + d.len],
                "record at {pos} differs"
            );
        }
    }

    let mut seen = 0u64;
    let mut cb = |_rec| {
        seen += 1;
        Ok(())
    };
    if let Ok(out) = scan_file(file, 0, generation, successor_end, &mut cb) {
        assert!(out.end <= file.len() as u64, "scan ended past the file");
        assert_eq!(out.records, seen);
    }
});
