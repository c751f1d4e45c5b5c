//! The journal's on-disk formats: records, file headers and the checkpoint
//! file, and [`scan_file`], the replay's scan of one file. Pure encode /
//! decode, no I/O; every decoder takes untrusted bytes and
//! never panics or allocates more than the input.
//!
//! A journal file is a [`FILE_HEADER_BYTES`] header block, then groups of
//! records. Each flushed group starts at an [`ALIGN_BYTES`]-aligned offset;
//! its last record has the [`FLAG_LAST_IN_GROUP`] flag and is followed by zero
//! padding up to the next aligned offset. A record (all integers big-endian):
//!
//! | offset | field | bytes |
//! |---|---|---|
//! | 0 | body length `n` (≥ 1) | 4 |
//! | 4 | CRC32C over bytes 0..4 and 8..32+n | 4 |
//! | 8 | generation: the `file_seq` of the file's current incarnation | 8 |
//! | 16 | synced offset: this file was fsynced up to here when written | 8 |
//! | 24 | flags (bit 0: last record of its group; other bits zero) | 1 |
//! | 25 | reserved, zero | 7 |
//! | 32 | body: kind (1 byte) then its fields | n |
//!
//! Bodies: 1 entry (ledger u64, entry i64, data), 2 master key (ledger u64,
//! key), 3 fence (ledger u64), 4 explicit LAC (ledger u64, lac i64, data),
//! 5 limbo (ledger u64, in_limbo u8).

use bytes::Bytes;

/// One journalled change.
#[derive(Debug, Clone, PartialEq)]
pub enum JournalRecord {
    /// An entry added to a ledger (the stored entry bytes).
    Entry {
        /// The ledger.
        ledger_id: u64,
        /// The entry id.
        entry_id: i64,
        /// The entry as stored.
        data: Bytes,
    },
    /// The master key of a ledger, journalled with its first add.
    MasterKey {
        /// The ledger.
        ledger_id: u64,
        /// Its master key.
        master_key: Bytes,
    },
    /// The ledger was fenced (journalled before the fence is reported).
    Fence {
        /// The ledger.
        ledger_id: u64,
    },
    /// An explicit LAC written by the ledger's writer.
    ExplicitLac {
        /// The ledger.
        ledger_id: u64,
        /// The last add confirmed.
        lac: i64,
        /// The LAC message as received.
        data: Bytes,
    },
    /// The ledger entered or left limbo (DESIGN §4.3).
    Limbo {
        /// The ledger.
        ledger_id: u64,
        /// Whether it is now in limbo.
        in_limbo: bool,
    },
}

/// Alignment of every group start, in bytes.
pub const ALIGN_BYTES: u64 = 512;
/// Size of the header block at the start of each journal file.
pub const FILE_HEADER_BYTES: u64 = 512;
/// Fixed bytes before a record's body.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Largest `data` (entry payload, LAC data) or master key a record may carry:
/// a 5 MiB frame plus 64 KiB of headroom (DESIGN §4.9).
pub const RECORD_DATA_BYTES_MAX: usize = 5 * 1024 * 1024 + 64 * 1024;
/// Largest body on disk: the data plus the fixed fields of the largest kind.
pub const RECORD_BODY_BYTES_MAX: usize = RECORD_DATA_BYTES_MAX + 17;
/// Flag bit: the last record of a flushed group (zero padding follows).
pub const FLAG_LAST_IN_GROUP: u8 = 1;

/// [`decode_at`]'s reason for zeros where a record would start.
pub const REASON_UNWRITTEN: &str = "zero length (unwritten space)";
/// [`decode_at`]'s reason for a record left from before the file was reused.
pub const REASON_OLD_GENERATION: &str = "not of this file's generation";

const KIND_ENTRY: u8 = 1;
const KIND_MASTER_KEY: u8 = 2;
const KIND_FENCE: u8 = 3;
const KIND_EXPLICIT_LAC: u8 = 4;
const KIND_LIMBO: u8 = 5;

const FILE_MAGIC: &[u8; 8] = b"CMSJRNL1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"CMSCKPT1";
/// Bytes of the checkpoint file.
pub const CHECKPOINT_BYTES: usize = 8 + 8 + 8 + 4;

/// Rounds `n` up to a multiple of [`ALIGN_BYTES`].
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// The variable bytes a record carries (what is bounded by
/// [`RECORD_DATA_BYTES_MAX`]).
pub fn data_len(rec: &JournalRecord) -> usize {
    match rec {
        JournalRecord::Entry { data, .. } | JournalRecord::ExplicitLac { data, .. } => data.len(),
        JournalRecord::MasterKey { master_key, .. } => master_key.len(),
        JournalRecord::Fence { .. } | JournalRecord::Limbo { .. } => 0,
    }
}

/// Body bytes of `rec` on disk.
pub fn body_len(rec: &JournalRecord) -> usize {
    1 + match rec {
        JournalRecord::Entry { data, .. } => 16 + data.len(),
        JournalRecord::MasterKey { master_key, .. } => 8 + master_key.len(),
        JournalRecord::Fence { .. } => 8,
        JournalRecord::ExplicitLac { data, .. } => 16 + data.len(),
        JournalRecord::Limbo { .. } => 9,
    }
}

/// Bytes of `rec` on disk, header included (padding excluded).
pub fn record_len(rec: &JournalRecord) -> usize {
    RECORD_HEADER_BYTES + body_len(rec)
}

fn record_crc(rec: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&rec[0..4]), &rec[8..])
}

/// Appends the encoded record to `buf`; returns where it starts in `buf`.
/// The caller has checked `data_len(rec) <= RECORD_DATA_BYTES_MAX`.
pub fn encode_into(
    buf: &mut Vec<u8>,
    rec: &JournalRecord,
    generation: u64,
    synced_offset: u64,
) -> usize {
    let start = encode_unsealed(buf, rec, generation, synced_offset);
    seal(buf, start, false);
    start
}

/// [`encode_into`] without the CRC: the record is invalid until [`seal`]ed.
/// A journal writer seals each record once, when it knows whether the record
/// ends its group, instead of computing the CRC at encode time and again when
/// [`mark_last_in_group`] sets the flag.
pub fn encode_unsealed(
    buf: &mut Vec<u8>,
    rec: &JournalRecord,
    generation: u64,
    synced_offset: u64,
) -> usize {
    let start = buf.len();
    let n = body_len(rec);
    // n <= RECORD_BODY_BYTES_MAX, far below u32::MAX.
    buf.extend_from_slice(&(n as u32).to_be_bytes());
    buf.extend_from_slice(&[0u8; 4]);
    buf.extend_from_slice(&generation.to_be_bytes());
    buf.extend_from_slice(&synced_offset.to_be_bytes());
    buf.extend_from_slice(&[0u8; 8]);
    match rec {
        JournalRecord::Entry {
            ledger_id,
            entry_id,
            data,
        } => {
            buf.push(KIND_ENTRY);
            buf.extend_from_slice(&ledger_id.to_be_bytes());
            buf.extend_from_slice(&entry_id.to_be_bytes());
            buf.extend_from_slice(data);
        }
        JournalRecord::MasterKey {
            ledger_id,
            master_key,
        } => {
            buf.push(KIND_MASTER_KEY);
            buf.extend_from_slice(&ledger_id.to_be_bytes());
            buf.extend_from_slice(master_key);
        }
        JournalRecord::Fence { ledger_id } => {
            buf.push(KIND_FENCE);
            buf.extend_from_slice(&ledger_id.to_be_bytes());
        }
        JournalRecord::ExplicitLac {
            ledger_id,
            lac,
            data,
        } => {
            buf.push(KIND_EXPLICIT_LAC);
            buf.extend_from_slice(&ledger_id.to_be_bytes());
            buf.extend_from_slice(&lac.to_be_bytes());
            buf.extend_from_slice(data);
        }
        JournalRecord::Limbo {
            ledger_id,
            in_limbo,
        } => {
            buf.push(KIND_LIMBO);
            buf.extend_from_slice(&ledger_id.to_be_bytes());
            buf.push(u8::from(*in_limbo));
        }
    }
    start
}

/// Computes and stores the CRC of the record at `buf[start..]` (which must be
/// the last one in `buf`), first setting [`FLAG_LAST_IN_GROUP`] if
/// `last_in_group`.
pub fn seal(buf: &mut [u8], start: usize, last_in_group: bool) {
    let rec = &mut buf[start..];
    if last_in_group {
        rec[24] |= FLAG_LAST_IN_GROUP;
    }
    let crc = record_crc(rec);
    rec[4..8].copy_from_slice(&crc.to_be_bytes());
}

/// Sets [`FLAG_LAST_IN_GROUP`] on the record at `buf[start..]` (which must be
/// the last one in `buf`) and recomputes its CRC.
pub fn mark_last_in_group(buf: &mut [u8], start: usize) {
    seal(buf, start, true);
}

/// A valid record found by [`decode_at`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The record (its data copied out of the scan buffer).
    pub record: JournalRecord,
    /// Bytes it occupies, header included, padding excluded.
    pub len: usize,
    /// The file offset fsynced when it was written.
    pub synced_offset: u64,
    /// Whether it ends its group.
    pub last_in_group: bool,
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    let s = b.get(i..i + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_be_bytes(a))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    let s = b.get(i..i + 4)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Some(u32::from_be_bytes(a))
}

/// Decodes the record at `buf[pos..]` if it is a valid record of
/// `generation`; otherwise says why not.
pub fn decode_at(buf: &[u8], pos: usize, generation: u64) -> Result<Decoded, &'static str> {
    let rest = buf.get(pos..).ok_or("past the end of the file")?;
    if rest.len() < RECORD_HEADER_BYTES {
        return Err("record header cut by the end of the file");
    }
    let n = u32_at(rest, 0).ok_or("short header")? as usize;
    if n == 0 {
        return Err(REASON_UNWRITTEN);
    }
    if n > RECORD_BODY_BYTES_MAX {
        return Err("length beyond the record bound");
    }
    // The generation is under the CRC; check it first so a scan through a
    // reused file skips old records without checksumming them.
    if u64_at(rest, 8) != Some(generation) {
        return Err(REASON_OLD_GENERATION);
    }
    let len = RECORD_HEADER_BYTES + n;
    let rec = rest.get(..len).ok_or("record cut by the end of the file")?;
    let stored = u32_at(rec, 4).ok_or("short header")?;
    if stored != record_crc(rec) {
        return Err("CRC32C mismatch");
    }
    let synced_offset = u64_at(rec, 16).ok_or("short header")?;
    let flags = rec[24];
    // Only our encoding is accepted (found by the `journal` fuzz target: a
    // CRC-valid record with other flag bits or reserved bytes decoded to a
    // record that re-encodes differently).
    if flags & !FLAG_LAST_IN_GROUP != 0 || rec[25..RECORD_HEADER_BYTES].iter().any(|&b| b != 0) {
        return Err("unknown flags or non-zero reserved header bytes");
    }
    let body = &rec[RECORD_HEADER_BYTES..];
    let record = decode_body(body).ok_or("malformed body")?;
    Ok(Decoded {
        record,
        len,
        synced_offset,
        last_in_group: flags & FLAG_LAST_IN_GROUP != 0,
    })
}

fn decode_body(body: &[u8]) -> Option<JournalRecord> {
    let (&kind, f) = body.split_first()?;
    let ledger_id = u64_at(f, 0)?;
    let rec = match kind {
        KIND_ENTRY => JournalRecord::Entry {
            ledger_id,
            entry_id: u64_at(f, 8)? as i64,
            data: Bytes::copy_from_slice(f.get(16..)?),
        },
        KIND_MASTER_KEY => JournalRecord::MasterKey {
            ledger_id,
            master_key: Bytes::copy_from_slice(f.get(8..)?),
        },
        KIND_FENCE if f.len() == 8 => JournalRecord::Fence { ledger_id },
        KIND_EXPLICIT_LAC => JournalRecord::ExplicitLac {
            ledger_id,
            lac: u64_at(f, 8)? as i64,
            data: Bytes::copy_from_slice(f.get(16..)?),
        },
        KIND_LIMBO if f.len() == 9 => JournalRecord::Limbo {
            ledger_id,
            in_limbo: match f[8] {
                0 => false,
                1 => true,
                _ => return None,
            },
        },
        _ => return None,
    };
    Some(rec)
}

/// How [`scan_file`] ended: where the file's valid records end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutcome {
    /// Offset just past the last valid record (aligned after a group's last).
    pub end: u64,
    /// Records handed to the callback.
    pub records: u64,
    /// `Some(reason)` when a torn tail (never synced) was cut at `end`;
    /// `None` when the file ended cleanly (unwritten or reused space at an
    /// aligned offset, or the limit reached).
    pub torn_tail: Option<&'static str>,
}

/// Why [`scan_file`] refused a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// A damaged record that was synced once (by a later record's word or
    /// the successor file's `prev_end`): the journal is corrupt.
    Corrupt {
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The callback refused the record at `offset`.
    Callback {
        /// The record's offset.
        offset: u64,
        /// The callback's reason.
        reason: String,
    },
}

/// Scans the records of one journal file whose bytes are `buf`, from
/// `start`, with the file's `generation`, handing each valid record to `cb`.
/// `successor_end`: where the next file says this one ends (its records must
/// reach exactly there). Pure: the replay's whole decision of where the log
/// ends (torn tail vs corruption, module docs of the bookie's replay) on
/// bytes in memory. Never panics on any input.
pub fn scan_file(
    buf: &[u8],
    start: usize,
    generation: u64,
    successor_end: Option<u64>,
    cb: &mut dyn FnMut(JournalRecord) -> Result<(), String>,
) -> Result<ScanOutcome, ScanError> {
    let limit = usize::try_from(successor_end.unwrap_or(buf.len() as u64))
        .unwrap_or(usize::MAX)
        .min(buf.len());
    let mut pos = start;
    let mut records = 0;
    let mut stop = None;
    while pos < limit {
        match decode_at(&buf[..limit], pos, generation) {
            Ok(d) => {
                cb(d.record).map_err(|reason| ScanError::Callback {
                    offset: pos as u64,
                    reason,
                })?;
                records += 1;
                pos += d.len;
                if d.last_in_group {
                    // The group's zero padding may be cut by the end of the
                    // file (a file shorter than its last aligned group): the
                    // records are whole, and they end at the end of the file,
                    // never past it (found by the `journal` fuzz target).
                    pos = (align_up(pos as u64) as usize).min(buf.len());
                }
            }
            Err(reason) => {
                stop = Some(reason);
                break;
            }
        }
    }
    let Some(reason) = stop else {
        if let Some(end) = successor_end
            && pos as u64 != end
        {
            return Err(ScanError::Corrupt {
                offset: pos as u64,
                reason: format!("records end here, but the next file says this one ends at {end}"),
            });
        }
        return Ok(ScanOutcome {
            end: pos as u64,
            records,
            torn_tail: None,
        });
    };
    if let Some(end) = successor_end {
        return Err(ScanError::Corrupt {
            offset: pos as u64,
            reason: format!("{reason}, before offset {end} the next file says was synced"),
        });
    }
    // Is a later valid record claiming this point as synced?
    let mut q = align_up(pos as u64 + 1) as usize;
    while q + RECORD_HEADER_BYTES <= buf.len() {
        if let Ok(d) = decode_at(buf, q, generation)
            && d.synced_offset > pos as u64
        {
            return Err(ScanError::Corrupt {
                offset: pos as u64,
                reason: format!(
                    "{reason}, but the record at offset {q} says the file was synced up to {}",
                    d.synced_offset
                ),
            });
        }
        q += ALIGN_BYTES as usize;
    }
    let clean_end = (pos as u64).is_multiple_of(ALIGN_BYTES)
        && (reason == REASON_UNWRITTEN || reason == REASON_OLD_GENERATION);
    Ok(ScanOutcome {
        end: pos as u64,
        records,
        torn_tail: (!clean_end).then_some(reason),
    })
}

/// The header of a journal file: who it is now and where its predecessor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The file's sequence number, also the generation of its records.
    pub file_seq: u64,
    /// The file written before this one (0 = none).
    pub prev_seq: u64,
    /// Where the predecessor's valid records end: everything before it was synced.
    pub prev_end: u64,
}

impl FileHeader {
    /// The header block ([`FILE_HEADER_BYTES`], zero padded).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FILE_HEADER_BYTES as usize);
        b.extend_from_slice(FILE_MAGIC);
        b.extend_from_slice(&self.file_seq.to_be_bytes());
        b.extend_from_slice(&self.prev_seq.to_be_bytes());
        b.extend_from_slice(&self.prev_end.to_be_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b.resize(FILE_HEADER_BYTES as usize, 0);
        b
    }

    /// Decodes a header block; `None` if it is not a valid header.
    pub fn decode(b: &[u8]) -> Option<FileHeader> {
        if b.get(..8)? != FILE_MAGIC {
            return None;
        }
        if u32_at(b, 32)? != crc32c::crc32c(b.get(..32)?) {
            return None;
        }
        Some(FileHeader {
            file_seq: u64_at(b, 8)?,
            prev_seq: u64_at(b, 16)?,
            prev_end: u64_at(b, 24)?,
        })
    }
}

/// Encodes the checkpoint file's content for mark `(file_seq, offset)`.
pub fn encode_checkpoint(file_seq: u64, offset: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(CHECKPOINT_BYTES);
    b.extend_from_slice(CHECKPOINT_MAGIC);
    b.extend_from_slice(&file_seq.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_be_bytes());
    b
}

/// Decodes the checkpoint file; `None` if it is not a valid one.
pub fn decode_checkpoint(b: &[u8]) -> Option<(u64, u64)> {
    if b.len() != CHECKPOINT_BYTES || b.get(..8)? != CHECKPOINT_MAGIC {
        return None;
    }
    if u32_at(b, 24)? != crc32c::crc32c(b.get(..24)?) {
        return None;
    }
    Some((u64_at(b, 8)?, u64_at(b, 16)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<JournalRecord> {
        vec![
            JournalRecord::Entry {
                ledger_id: 7,
                entry_id: 3,
                data: Bytes::from_static(b"payload"),
            },
            JournalRecord::MasterKey {
                ledger_id: 7,
                master_key: Bytes::from_static(b"key"),
            },
            JournalRecord::Fence { ledger_id: 9 },
            JournalRecord::ExplicitLac {
                ledger_id: 9,
                lac: -1,
                data: Bytes::new(),
            },
            JournalRecord::Limbo {
                ledger_id: 1,
                in_limbo: true,
            },
        ]
    }

    #[test]
    fn a_record_sealed_once_equals_one_encoded_then_marked() {
        for rec in all_kinds() {
            for last in [false, true] {
                let mut want = vec![0x55; 5];
                let start = encode_into(&mut want, &rec, 4, 4096);
                if last {
                    mark_last_in_group(&mut want, start);
                }
                let mut got = vec![0x55; 5];
                let s = encode_unsealed(&mut got, &rec, 4, 4096);
                assert_eq!(s, start);
                assert!(decode_at(&got, s, 4).is_err(), "unsealed is invalid");
                seal(&mut got, s, last);
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn every_kind_round_trips_with_its_header_fields() {
        for rec in all_kinds() {
            let mut buf = vec![0xAA; 3];
            let start = encode_into(&mut buf, &rec, 42, 1024);
            assert_eq!(buf.len() - start, record_len(&rec));
            let d = decode_at(&buf, start, 42).unwrap();
            assert_eq!(d.record, rec);
            assert_eq!(d.len, record_len(&rec));
            assert_eq!(d.synced_offset, 1024);
            assert!(!d.last_in_group);
            mark_last_in_group(&mut buf, start);
            assert!(decode_at(&buf, start, 42).unwrap().last_in_group);
        }
    }

    #[test]
    fn any_flipped_bit_or_other_generation_is_rejected() {
        let rec = &all_kinds()[0];
        let mut buf = Vec::new();
        encode_into(&mut buf, rec, 5, 512);
        assert_eq!(
            decode_at(&buf, 0, 6).unwrap_err(),
            "not of this file's generation"
        );
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                assert!(decode_at(&b, 0, 5).is_err(), "flip at byte {i} bit {bit}");
            }
        }
        for cut in 0..buf.len() {
            assert!(decode_at(&buf[..cut], 0, 5).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn unknown_flags_and_reserved_bytes_are_rejected_even_with_a_valid_crc() {
        let rec = &all_kinds()[0];
        for (at, value) in [(24, FLAG_LAST_IN_GROUP | 0x80), (25, 1), (31, 0xff)] {
            let mut buf = Vec::new();
            encode_into(&mut buf, rec, 9, 0);
            buf[at] = value;
            let crc = record_crc(&buf);
            buf[4..8].copy_from_slice(&crc.to_be_bytes());
            assert_eq!(
                decode_at(&buf, 0, 9).err(),
                Some("unknown flags or non-zero reserved header bytes"),
                "byte {at} = {value:#x}"
            );
        }
        // The one flag we write is accepted.
        let mut buf = Vec::new();
        encode_into(&mut buf, rec, 9, 0);
        mark_last_in_group(&mut buf, 0);
        assert!(decode_at(&buf, 0, 9).unwrap().last_in_group);
    }

    #[test]
    fn oversized_or_zero_length_is_rejected_before_reading_the_body() {
        let mut b = vec![0u8; 64];
        assert_eq!(
            decode_at(&b, 0, 0).unwrap_err(),
            "zero length (unwritten space)"
        );
        b[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            decode_at(&b, 0, 0).unwrap_err(),
            "length beyond the record bound"
        );
    }

    #[test]
    fn file_header_and_checkpoint_round_trip_and_reject_damage() {
        let h = FileHeader {
            file_seq: 3,
            prev_seq: 2,
            prev_end: 4096,
        };
        let mut b = h.encode();
        assert_eq!(b.len() as u64, FILE_HEADER_BYTES);
        assert_eq!(FileHeader::decode(&b), Some(h));
        b[17] ^= 1;
        assert_eq!(FileHeader::decode(&b), None);
        assert_eq!(FileHeader::decode(&[0u8; 512]), None);
        let mut c = encode_checkpoint(3, 1536);
        assert_eq!(decode_checkpoint(&c), Some((3, 1536)));
        c[9] ^= 1;
        assert_eq!(decode_checkpoint(&c), None);
        assert_eq!(decode_checkpoint(&c[..10]), None);
    }

    /// Fuzz finding (`journal` target): a file cut inside the zero padding
    /// after its last group made the scan report an end past the file.
    #[test]
    fn scan_end_never_passes_a_file_cut_in_its_padding() {
        let mut file = Vec::new();
        let start = encode_into(&mut file, &all_kinds()[0], 3, 0);
        mark_last_in_group(&mut file, start);
        let records_end = file.len();
        assert!(records_end < ALIGN_BYTES as usize);
        file.resize(records_end + 10, 0); // padding cut short
        let mut n = 0;
        let out = scan_file(&file, 0, 3, None, &mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((out.end, out.records, n), (file.len() as u64, 1, 1));
        assert_eq!(out.torn_tail, None);
        // A successor naming that end links to it.
        let linked = scan_file(&file, 0, 3, Some(file.len() as u64), &mut |_| Ok(())).unwrap();
        assert_eq!(linked.end, file.len() as u64);
        // A whole file still ends on the aligned offset.
        file.resize(2 * ALIGN_BYTES as usize, 0);
        let whole = scan_file(&file, 0, 3, None, &mut |_| Ok(())).unwrap();
        assert_eq!(whole.end, ALIGN_BYTES);
    }

    #[test]
    fn scan_cuts_a_torn_tail_and_refuses_a_synced_damaged_record() {
        let mut file = Vec::new();
        for rec in &all_kinds()[..2] {
            encode_into(&mut file, rec, 3, 0);
        }
        let first_len = record_len(&all_kinds()[0]);
        // Damage the second record: a torn tail (nothing says it was synced).
        let mut torn = file.clone();
        let last = torn.len() - 1;
        torn[last] ^= 1;
        let out = scan_file(&torn, 0, 3, None, &mut |_| Ok(())).unwrap();
        assert_eq!((out.end, out.records), (first_len as u64, 1));
        assert_eq!(out.torn_tail, Some("CRC32C mismatch"));
        // A later aligned record says the file was synced past it: corrupt.
        torn.resize(ALIGN_BYTES as usize, 0);
        encode_into(&mut torn, &all_kinds()[2], 3, ALIGN_BYTES);
        assert!(matches!(
            scan_file(&torn, 0, 3, None, &mut |_| Ok(())),
            Err(ScanError::Corrupt { offset, .. }) if offset == first_len as u64
        ));
        // The callback's refusal is reported with the record's offset.
        assert_eq!(
            scan_file(&file, 0, 3, None, &mut |_| Err("no".into())),
            Err(ScanError::Callback {
                offset: 0,
                reason: "no".into()
            })
        );
    }
}
