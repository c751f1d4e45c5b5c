//! Writes the seed corpus `fuzz/seeds/<target>/` from the real encoders, so
//! every target starts from valid, CRC-correct inputs of each kind (random
//! mutation alone rarely produces a matching CRC32C). Deterministic: the
//! committed seeds are its output.
//!
//!   cargo +nightly run --manifest-path fuzz/Cargo.toml --target-dir target/fuzz --example seeds

use std::fs;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use cms_bookie_format::entry::{Entry, EntryHeader};
use cms_bookie_format::entry_log::encode_record;
use cms_bookie_format::journal::{
    FileHeader, JournalRecord, encode_checkpoint, encode_into, mark_last_in_group,
};
use cms_bookie_format::lac::encode_explicit_lac;
use cms_bookie_format::proto::bookie::{
    AddRequest, ReadLacResponse, ReadRangeResponse, ReadResponse, WriteLacRequest,
};
use cms_client::proto::batch::encode_batched;
use cms_client::proto::commands;
use cms_client::proto::frame::{encode_command, encode_payload, entry_from_parts};
use cms_client::proto::pulsar::command_subscribe::{InitialPosition, SubType};
use cms_client::proto::pulsar::{MessageMetadata, SingleMessageMetadata};
use prost::Message;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    fs::create_dir_all(&dir).expect("create seed dir");
    fs::write(dir.join(name), bytes).expect("write seed");
}

fn batch_payload(n: usize) -> Bytes {
    let mut buf = BytesMut::new();
    for i in 0..n {
        let m = SingleMessageMetadata {
            partition_key: Some(format!("key-{i}")),
            sequence_id: Some(i as u64),
            event_time: Some(1000 + i as u64),
            ..Default::default()
        };
        encode_batched(&mut buf, &m, format!("message {i}").as_bytes());
    }
    buf.freeze()
}

fn batch_entry(n: i32) -> Bytes {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 7,
        publish_time: 1,
        num_messages_in_batch: Some(n),
        ..Default::default()
    };
    entry_from_parts(&meta, &batch_payload(n as usize))
}

fn frames() {
    let cmds = vec![
        ("connect", commands::connect("seed", 20)),
        (
            "lookup",
            commands::lookup("persistent://public/default/t", 1, false),
        ),
        (
            "producer",
            commands::producer("persistent://public/default/t", 1, 2, Some("p")),
        ),
        (
            "subscribe",
            commands::subscribe(
                "persistent://public/default/t",
                "s",
                SubType::Shared,
                1,
                3,
                InitialPosition::Earliest,
            ),
        ),
        ("flow", commands::flow(1, 1000)),
        ("ping", commands::ping()),
    ];
    for (name, cmd) in cmds {
        let mut b = BytesMut::new();
        encode_command(&cmd, &mut b);
        write("frame_decoder", name, &b);
    }
    let mut b = BytesMut::new();
    encode_payload(&commands::send(1, 7, 3), &batch_entry(3), &mut b);
    write("frame_decoder", "send_batch", &b);
    let mut b = BytesMut::new();
    encode_payload(&commands::message(1, 5, 9, 0), &batch_entry(2), &mut b);
    write("frame_decoder", "message_batch", &b);
}

fn batches() {
    write("batch", "entry_batch_3", &batch_entry(3));
    for n in [1u32, 3] {
        let mut b = n.to_be_bytes().to_vec();
        b.extend_from_slice(&batch_payload(n as usize));
        write("batch", &format!("payload_{n}"), &b);
    }
}

fn bookie_protocol() {
    let header = EntryHeader {
        ledger_id: 7,
        entry_id: 3,
        lac: 2,
        length: 42,
    };
    let entry = Entry::encode(header, b"an entry payload");
    let with_kind = |kind: u8, m: &dyn Fn() -> Vec<u8>| {
        let mut b = vec![kind];
        b.extend_from_slice(&m());
        b
    };
    let add = AddRequest {
        request_id: 1,
        ledger_id: 7,
        entry_id: 3,
        master_key: Bytes::from_static(b"key"),
        flags: 0,
        body: entry.clone(),
    };
    write(
        "bookie_protocol",
        "add",
        &with_kind(0, &|| add.encode_to_vec()),
    );
    let read = ReadResponse {
        ledger_id: 7,
        entry_id: 3,
        body: entry.clone(),
        ..Default::default()
    };
    write(
        "bookie_protocol",
        "read",
        &with_kind(3, &|| read.encode_to_vec()),
    );
    let range = ReadRangeResponse {
        ledger_id: 7,
        first_entry_id: 3,
        bodies: vec![entry.clone(), entry.clone()],
        ..Default::default()
    };
    write(
        "bookie_protocol",
        "read_range",
        &with_kind(5, &|| range.encode_to_vec()),
    );
    let lac = ReadLacResponse {
        ledger_id: 7,
        lac_body: encode_explicit_lac(7, 2),
        last_entry_body: entry.clone(),
        ..Default::default()
    };
    write(
        "bookie_protocol",
        "read_lac",
        &with_kind(9, &|| lac.encode_to_vec()),
    );
    let wlac = WriteLacRequest {
        ledger_id: 7,
        master_key: Bytes::from_static(b"key"),
        lac: 2,
        body: encode_explicit_lac(7, 2),
    };
    write(
        "bookie_protocol",
        "write_lac",
        &with_kind(10, &|| wlac.encode_to_vec()),
    );
    write(
        "bookie_protocol",
        "raw_entry",
        &with_kind(15, &|| entry.to_vec()),
    );
}

fn journal() {
    let generation = 3u64;
    let records = [
        JournalRecord::MasterKey {
            ledger_id: 7,
            master_key: Bytes::from_static(b"key"),
        },
        JournalRecord::Entry {
            ledger_id: 7,
            entry_id: 0,
            data: Bytes::from_static(b"entry bytes"),
        },
        JournalRecord::Fence { ledger_id: 7 },
        JournalRecord::ExplicitLac {
            ledger_id: 7,
            lac: 0,
            data: encode_explicit_lac(7, 0),
        },
        JournalRecord::Limbo {
            ledger_id: 7,
            in_limbo: true,
        },
    ];
    // Two groups: records 0..3 then 3..5, each ending on an aligned offset.
    let mut file = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        let synced = file.len() as u64;
        let last = encode_into(&mut file, rec, generation, synced);
        if i == 2 || i == 4 {
            mark_last_in_group(&mut file, last);
            file.resize(file.len().div_ceil(512) * 512, 0);
        }
    }
    // Flags byte (no successor) and the successor end, then the file.
    let mut input = vec![0u8; 9];
    input.extend_from_slice(&file);
    write("journal", "two_groups", &input);
    let mut torn = input.clone();
    torn.truncate(9 + 100);
    write("journal", "torn_tail", &torn);
    let mut linked = vec![1u8];
    linked.extend_from_slice(&(file.len() as u64).to_be_bytes());
    linked.extend_from_slice(&file);
    write("journal", "successor_end", &linked);
    let header = FileHeader {
        file_seq: 3,
        prev_seq: 2,
        prev_end: 4096,
    };
    write("journal", "file_header", &header.encode()[..64]);
    write("journal", "checkpoint", &encode_checkpoint(3, 1536));
}

fn entry_log() {
    let mut b = Vec::new();
    b.extend_from_slice(&7u64.to_be_bytes());
    b.extend_from_slice(&3i64.to_be_bytes());
    encode_record(&mut b, 7, 3, b"entry stored in a log");
    write("entry_log", "record", &b);
    let mut empty = Vec::new();
    empty.extend_from_slice(&1u64.to_be_bytes());
    empty.extend_from_slice(&0i64.to_be_bytes());
    encode_record(&mut empty, 1, 0, b"");
    write("entry_log", "empty_record", &empty);
}

fn main() {
    frames();
    batches();
    bookie_protocol();
    journal();
    entry_log();
}
