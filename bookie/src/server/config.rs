//! Configuration of `cms-bookie serve`: one struct that is at once the clap
//! flags (with defaults and units in `--help`), the TOML keys and the
//! `CMS_BOOKIE_*` environment keys (see `cms_common::config`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::journal::{JournalConfig, SyncPolicy};
use crate::metadata::connect::MetadataUrl;
use crate::metadata::zk::ZkOptions;
use crate::storage::StorageConfig;

use super::core::{CoreLimits, ENTRY_BYTES_MAX_DEFAULT};
use super::grpc::GrpcLimits;
use crate::fair::SchedConfig;

/// Parses `key=weight,key=weight` (weights ≥ 1; empty = none).
pub fn parse_key_weights(s: &str) -> Result<HashMap<String, u32>, String> {
    let mut out = HashMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, w) = part
            .rsplit_once('=')
            .ok_or_else(|| format!("{part:?} is not key=weight"))?;
        let w: u32 = w
            .trim()
            .parse()
            .map_err(|e| format!("weight of {k:?}: {e}"))?;
        if w == 0 {
            return Err(format!("weight of {k:?} must be at least 1"));
        }
        out.insert(k.trim().to_string(), w);
    }
    Ok(out)
}

/// Options of `cms-bookie serve`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookieConfig {
    /// Metadata store URL: `zk://host:port[,host:port...][/chroot]` or
    /// `file:///abs/path/metadata.redb` (embedded, one process only).
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    pub metadata_url: String,
    /// Root node of the CMS layout inside the store.
    #[arg(long, default_value = "/cms")]
    pub metadata_root: String,
    /// ZooKeeper session timeout, in milliseconds.
    #[arg(long, default_value_t = 6000)]
    pub metadata_session_timeout_ms: u64,
    /// Timeout of one metadata operation and of connecting, in milliseconds.
    #[arg(long, default_value_t = 10000)]
    pub metadata_operation_timeout_ms: u64,

    /// Stable id of this bookie (not its address); empty = `<advertised host>-<gRPC port>`.
    #[arg(long, default_value = "")]
    pub bookie_id: String,
    /// Rack or zone, for placement across failure domains; empty = none.
    #[arg(long, default_value = "")]
    pub rack: String,
    /// gRPC listen address (bookie protocol).
    #[arg(long, default_value = "0.0.0.0:3181")]
    pub grpc_bind: String,
    /// HTTP listen address (`/health`, `/ready`, `/metrics`).
    #[arg(long, default_value = "0.0.0.0:8000")]
    pub http_bind: String,
    /// Host clients use to reach this bookie; empty = the bind host (127.0.0.1 for 0.0.0.0).
    #[arg(long, default_value = "")]
    pub advertised_host: String,

    /// Journal directory (write-ahead log).
    #[arg(long, default_value = "data/bookie/journal")]
    pub journal_dir: PathBuf,
    /// Ledger directory (entry logs and index).
    #[arg(long, default_value = "data/bookie/ledgers")]
    pub ledger_dir: PathBuf,

    /// When an add is acknowledged: `fsync-before-ack` (default, durable) or
    /// `relaxed-ack-before-fsync` (opt-in: a power loss can lose acked entries).
    #[arg(long, value_enum, default_value_t = SyncPolicy::FsyncBeforeAck)]
    pub sync_policy: SyncPolicy,
    /// fdatasync period under `relaxed-ack-before-fsync`, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub relaxed_sync_interval_ms: u64,
    /// Size of each preallocated, zero-filled journal file, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub journal_file_bytes: u64,
    /// Longest an add waits for its group to fill before the group is synced, in µs.
    #[arg(long, default_value_t = 500)]
    pub group_commit_delay_us_max: u64,
    /// A group is synced once it holds this many bytes.
    #[arg(long, default_value_t = 512 * 1024)]
    pub group_commit_bytes_max: usize,
    /// Write journal groups with direct I/O (`O_DIRECT | O_DSYNC`, one
    /// system call, no page cache) under `fsync-before-ack`; `false` = a
    /// buffered write then `fdatasync`. Equally durable; direct costs less
    /// CPU. File systems without direct I/O (tmpfs) use the pair anyway.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub journal_direct_io: bool,
    /// Under `fsync-before-ack`, let the runtime thread write a small journal
    /// group itself while the journal's writer thread is idle (no thread
    /// hand-off per add); `false` = every group goes through the writer
    /// thread. Equally durable. Groups of more than 4 records or 64 KiB,
    /// rotations and the second after an inline write slower than 10 ms
    /// always go to the writer thread.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub journal_inline_writes: bool,
    /// Records queued for the journal before adds get TOO_MANY_REQUESTS.
    #[arg(long, default_value_t = 10_000)]
    pub journal_queue_records_max: usize,

    /// Entry-log roll size, in bytes.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    pub entry_log_bytes_max: u64,
    /// Write cache (two halves), in bytes.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub write_cache_bytes_max: usize,
    /// Read cache, in bytes.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub read_cache_bytes_max: usize,
    /// Page cache of the entry-location index (redb), in bytes.
    #[arg(long, default_value_t = crate::storage::INDEX_CACHE_BYTES_MAX)]
    pub index_cache_bytes_max: usize,
    /// Entries read ahead after a cache miss.
    #[arg(long, default_value_t = 100)]
    pub read_ahead_entries_max: usize,
    /// Bytes read ahead after a cache miss (the entry itself is always read,
    /// whatever its size). Smaller spans make a catch-up reader's disk and
    /// CPU work come in smaller, more frequent pieces.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub read_ahead_bytes_max: usize,
    /// Most bytes one entry-log read asks the disk for at a time: a
    /// read-ahead goes to the disk in pieces of this size, so a journal
    /// write or flush waits behind one piece at most (docs/isolation.md).
    #[arg(long, default_value_t = crate::fs::READ_PIECE_BYTES)]
    pub read_io_bytes_max: usize,
    /// I/O class of reads that go to entry logs: `idle` (journal and flush
    /// writes go first at the disk scheduler; see docs/isolation.md) or
    /// `normal`.
    #[arg(long, value_enum, default_value_t = crate::storage::ReadIoClass::Idle)]
    pub read_io_class: crate::storage::ReadIoClass,
    /// Threads of the async runtime (gRPC, HTTP, the add and read paths);
    /// 0 = one per CPU the process may use, 1 = a single-threaded runtime on
    /// the main thread. Where the bookie shares few
    /// cores with other servers, fewer threads switch less.
    #[arg(long, default_value_t = 0)]
    pub worker_threads: usize,
    /// Checkpoint period (write cache flushed, journal trimmed), in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_interval_ms: u64,

    /// Disk use (fraction) above which the bookie turns read-only.
    #[arg(long, default_value_t = 0.95)]
    pub disk_usage_threshold: f64,
    /// Disk use (fraction) below which a read-only bookie turns writable again.
    #[arg(long, default_value_t = 0.90)]
    pub disk_usage_lwm: f64,
    /// Disk check period, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub disk_check_interval_ms: u64,

    /// Garbage-collection period, in milliseconds.
    #[arg(long, default_value_t = 600_000)]
    pub gc_interval_ms: u64,
    /// A ledger's data is deleted only after its metadata has been seen absent
    /// for this long, in milliseconds.
    #[arg(long, default_value_t = 3_600_000)]
    pub gc_grace_ms: u64,
    /// Entry logs whose live fraction is below this are compacted.
    #[arg(long, default_value_t = 0.5)]
    pub compaction_threshold: f64,
    /// Free space kept for compaction, in bytes.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    pub reserved_bytes: u64,

    /// Largest entry accepted, in bytes (a 5 MiB Pulsar message plus metadata).
    #[arg(long, default_value_t = ENTRY_BYTES_MAX_DEFAULT)]
    pub entry_bytes_max: usize,
    /// Adds in flight on one add stream.
    #[arg(long, default_value_t = 10_000)]
    pub adds_in_flight_per_stream_max: usize,
    /// Reads in flight over all connections.
    #[arg(long, default_value_t = 64)]
    pub reads_in_flight_max: usize,
    /// Reads in flight for one fairness key (the broker sends the tenant).
    #[arg(long, default_value_t = 16)]
    pub reads_per_key_in_flight_max: usize,
    /// Estimated bytes of reads in flight for one fairness key (a key's
    /// first read is admitted whatever its size).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub read_bytes_per_key_in_flight_max: u64,
    /// Reads queued for one fairness key; further reads are answered
    /// TOO_MANY_REQUESTS at once.
    #[arg(long, default_value_t = 4096)]
    pub read_queue_requests_per_key_max: usize,
    /// Estimated bytes of reads queued for one fairness key; further reads
    /// are answered TOO_MANY_REQUESTS at once.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub read_queue_bytes_per_key_max: u64,
    /// Fairness keys tracked; keys beyond share one queue.
    #[arg(long, default_value_t = 10_000)]
    pub read_fairness_keys_max: usize,
    /// Read scheduler credit per round per unit of weight, in bytes
    /// (deficit round robin by bytes).
    #[arg(long, default_value_t = 64 * 1024)]
    pub read_quantum_bytes: u64,
    /// Weight of a fairness key not named in `read_key_weights`.
    #[arg(long, default_value_t = 4)]
    pub read_weight_default: u32,
    /// Weights of named fairness keys, `key=weight,...`. The defaults give
    /// autorecovery's re-replication and audit reads a quarter of a normal
    /// key's share when reads contend.
    #[arg(long, default_value = "@autorecovery=1,@autorecovery-audit=1")]
    pub read_key_weights: String,
    /// Longest wait of a long-poll read, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub long_poll_ms_max: u64,
    /// Deadline of one request (not of the add stream), in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub request_timeout_ms: u64,
    /// Most bytes in one range-read response.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub read_range_bytes_max: usize,

    /// Also run autorecovery (auditor election + re-replication worker) in
    /// this process.
    #[arg(long, default_value_t = false)]
    pub autorecovery: bool,
    /// Autorecovery: a bookie missing this long is lost and its ledgers are
    /// re-replicated, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub lost_bookie_grace_ms: u64,
    /// Autorecovery: an OPEN under-replicated ledger is recovery-opened
    /// (its writer fenced) only after this long, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub open_ledger_grace_ms: u64,
    /// Autorecovery: period of the audit and of the worker's scan, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub autorecovery_interval_ms: u64,
    /// Autorecovery: entries copied per second at most (0 = unlimited).
    #[arg(long, default_value_t = 5_000)]
    pub replication_entries_per_s_max: u64,
    /// Autorecovery: entry bytes copied per second at most (0 = unlimited).
    #[arg(long, default_value_t = 50 * 1024 * 1024)]
    pub replication_bytes_per_s_max: u64,
    /// Autorecovery: period of the auditor's sampled integrity check of
    /// closed ledgers (reads a sample of entries from every replica), in
    /// milliseconds; 0 turns it off.
    #[arg(long, default_value_t = 3_600_000)]
    pub sample_check_interval_ms: u64,
    /// Autorecovery: random entries the sampled check reads per segment,
    /// besides the first E and the last entry of each segment.
    #[arg(long, default_value_t = 4)]
    pub sample_reads_per_segment: usize,

    /// TESTS ONLY: run storage on the fault-injecting file system and serve
    /// `POST /test/power-cut` and `POST /test/fail-next-sync` on the HTTP port.
    #[arg(long, default_value_t = false)]
    pub fault_injection: bool,
}

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct InvalidConfig {
    /// The key.
    pub key: String,
    /// Why.
    pub reason: String,
}

fn invalid(key: &str, reason: impl Into<String>) -> InvalidConfig {
    InvalidConfig {
        key: key.into(),
        reason: reason.into(),
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

impl BookieConfig {
    /// The autorecovery options of this config; `name` labels the auditor
    /// and lock nodes.
    pub fn autorecovery_config(&self, name: &str) -> crate::autorecovery::AutorecoveryConfig {
        crate::autorecovery::AutorecoveryConfig {
            name: name.to_string(),
            lost_bookie_grace_ms: self.lost_bookie_grace_ms,
            open_ledger_grace_ms: self.open_ledger_grace_ms,
            audit_interval_ms: self.autorecovery_interval_ms.max(1),
            replication_entries_per_s_max: self.replication_entries_per_s_max,
            replication_bytes_per_s_max: self.replication_bytes_per_s_max,
            sample_check_interval_ms: self.sample_check_interval_ms,
            sample_reads_per_segment: self.sample_reads_per_segment,
            auditor: true,
            worker: true,
        }
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.grpc_addr()?;
        self.http_addr()?;
        if !(0.0..=1.0).contains(&self.disk_usage_threshold) {
            return Err(invalid("disk_usage_threshold", "must be within 0.0..=1.0"));
        }
        if self.disk_usage_lwm > self.disk_usage_threshold {
            return Err(invalid(
                "disk_usage_lwm",
                "must not be above disk_usage_threshold",
            ));
        }
        if self.worker_threads > 1024 {
            return Err(invalid(
                "worker_threads",
                "must be at most 1024 (0 = one per CPU)",
            ));
        }
        if self.read_io_bytes_max < 4096 {
            return Err(invalid("read_io_bytes_max", "must be at least 4096"));
        }
        if self.read_ahead_bytes_max > self.read_cache_bytes_max {
            return Err(invalid(
                "read_ahead_bytes_max",
                format!(
                    "must not be above read_cache_bytes_max ({}): a read-ahead lands in the read cache",
                    self.read_cache_bytes_max
                ),
            ));
        }
        if self.journal_file_bytes < 64 * 1024 {
            return Err(invalid("journal_file_bytes", "must be at least 65536"));
        }
        if self.entry_bytes_max == 0 || self.entry_bytes_max > crate::journal::RECORD_DATA_BYTES_MAX
        {
            return Err(invalid(
                "entry_bytes_max",
                format!(
                    "must be within 1..={} (the journal's record bound)",
                    crate::journal::RECORD_DATA_BYTES_MAX
                ),
            ));
        }
        let file_min = crate::journal::file_bytes_min_for(self.entry_bytes_max);
        if self.journal_file_bytes < file_min {
            return Err(invalid(
                "journal_file_bytes",
                format!(
                    "must be at least {file_min} so that one entry of entry_bytes_max ({}) fits a journal file",
                    self.entry_bytes_max
                ),
            ));
        }
        if self.long_poll_ms_max >= self.request_timeout_ms {
            return Err(invalid(
                "long_poll_ms_max",
                "must be below request_timeout_ms",
            ));
        }
        if self.journal_dir == self.ledger_dir {
            return Err(invalid("ledger_dir", "must differ from journal_dir"));
        }
        if self.read_weight_default == 0 {
            return Err(invalid("read_weight_default", "must be at least 1"));
        }
        parse_key_weights(&self.read_key_weights)
            .map_err(|reason| invalid("read_key_weights", reason))?;
        Ok(())
    }

    /// The metadata store URL.
    pub fn metadata_url(&self) -> Result<MetadataUrl, InvalidConfig> {
        self.metadata_url
            .parse()
            .map_err(|reason: String| invalid("metadata_url", reason))
    }

    /// The ZooKeeper session and operation timeouts.
    pub fn zk_options(&self) -> ZkOptions {
        ZkOptions {
            session_timeout_ms: self.metadata_session_timeout_ms,
            connect_timeout_ms: self.metadata_operation_timeout_ms,
            operation_timeout_ms: self.metadata_operation_timeout_ms,
        }
    }

    /// The gRPC listen address.
    pub fn grpc_addr(&self) -> Result<SocketAddr, InvalidConfig> {
        self.grpc_bind
            .parse()
            .map_err(|e| invalid("grpc_bind", format!("{:?}: {e}", self.grpc_bind)))
    }

    /// The HTTP listen address.
    pub fn http_addr(&self) -> Result<SocketAddr, InvalidConfig> {
        self.http_bind
            .parse()
            .map_err(|e| invalid("http_bind", format!("{:?}: {e}", self.http_bind)))
    }

    /// The host other processes use to reach this bookie.
    pub fn advertised_host(&self, bound: SocketAddr) -> String {
        if !self.advertised_host.is_empty() {
            return self.advertised_host.clone();
        }
        if bound.ip().is_unspecified() {
            "127.0.0.1".into()
        } else {
            bound.ip().to_string()
        }
    }

    /// The bookie id: configured, or derived from the advertised gRPC address.
    pub fn bookie_id(&self, advertised: &str, grpc_port: u16) -> String {
        if self.bookie_id.is_empty() {
            format!("{advertised}-{grpc_port}")
        } else {
            self.bookie_id.clone()
        }
    }

    /// Absolute journal directory.
    pub fn journal_dir_abs(&self) -> PathBuf {
        absolute(&self.journal_dir)
    }

    /// Absolute ledger directory.
    pub fn ledger_dir_abs(&self) -> PathBuf {
        absolute(&self.ledger_dir)
    }

    /// The journal's configuration.
    pub fn journal(&self) -> JournalConfig {
        JournalConfig {
            dir: self.journal_dir_abs(),
            file_bytes: self.journal_file_bytes,
            group_commit_delay_us_max: self.group_commit_delay_us_max,
            group_commit_bytes_max: self.group_commit_bytes_max,
            queue_records_max: self.journal_queue_records_max,
            sync_policy: self.sync_policy,
            relaxed_sync_interval_ms: self.relaxed_sync_interval_ms,
            spare_files_max: 2,
            direct_io: self.journal_direct_io,
            inline_writes: self.journal_inline_writes,
        }
    }

    /// Ledger storage's configuration.
    pub fn storage(&self) -> StorageConfig {
        StorageConfig {
            ledger_dir: self.ledger_dir_abs(),
            entry_log_bytes_max: self.entry_log_bytes_max,
            write_cache_bytes_max: self.write_cache_bytes_max,
            read_cache_bytes_max: self.read_cache_bytes_max,
            index_cache_bytes_max: self.index_cache_bytes_max,
            read_ahead_entries_max: self.read_ahead_entries_max,
            read_ahead_bytes_max: self.read_ahead_bytes_max,
            read_io_bytes_max: self.read_io_bytes_max,
            read_io_class: self.read_io_class,
            compaction_threshold: self.compaction_threshold,
            reserved_bytes: self.reserved_bytes,
        }
    }

    /// Request-path bounds.
    pub fn core_limits(&self) -> CoreLimits {
        CoreLimits {
            entry_bytes_max: self.entry_bytes_max,
            read_range_entries_max: 1_000,
            read_range_bytes_max: self.read_range_bytes_max,
            long_poll_ms_max: self.long_poll_ms_max,
            write_cache_wait_ms_max: 1_000,
        }
    }

    /// gRPC-layer bounds.
    pub fn grpc_limits(&self) -> GrpcLimits {
        GrpcLimits {
            adds_in_flight_per_stream_max: self.adds_in_flight_per_stream_max,
            reads: SchedConfig {
                in_flight_max: self.reads_in_flight_max,
                key_in_flight_max: self.reads_per_key_in_flight_max,
                key_in_flight_bytes_max: self.read_bytes_per_key_in_flight_max,
                key_queue_requests_max: self.read_queue_requests_per_key_max,
                key_queue_bytes_max: self.read_queue_bytes_per_key_max,
                keys_max: self.read_fairness_keys_max,
                quantum_bytes: self.read_quantum_bytes,
                weight_default: self.read_weight_default,
                // Checked by `validate`.
                weights: parse_key_weights(&self.read_key_weights).unwrap_or_default(),
                entry_bytes_initial: 4096,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Command, FromArgMatches};

    fn parse(args: &[&str]) -> BookieConfig {
        let matches = BookieConfig::augment_args(Command::new("bookie"))
            .try_get_matches_from(std::iter::once("bookie").chain(args.iter().copied()))
            .unwrap();
        BookieConfig::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn defaults_are_valid() {
        parse(&[]).validate().unwrap();
        let w = parse(&[]).grpc_limits().reads.weights;
        assert_eq!(w.get("@autorecovery"), Some(&1));
    }

    #[test]
    fn read_key_weights_are_checked() {
        assert_eq!(
            parse_key_weights(" a=2, b=1 ,").unwrap(),
            HashMap::from([("a".to_string(), 2), ("b".to_string(), 1)])
        );
        for bad in ["a", "a=0", "a=x"] {
            assert!(parse_key_weights(bad).is_err(), "{bad}");
            let err = parse(&[&format!("--read-key-weights={bad}")])
                .validate()
                .unwrap_err();
            assert_eq!(err.key, "read_key_weights");
        }
    }

    #[test]
    fn read_ahead_reaches_storage_and_fits_the_read_cache() {
        let c = parse(&["--read-ahead-bytes-max=524288"]);
        c.validate().unwrap();
        assert_eq!(c.storage().read_ahead_bytes_max, 512 * 1024);
        assert_eq!(parse(&[]).storage().read_ahead_bytes_max, 4 << 20);
        let err = parse(&[
            "--read-cache-bytes-max=1048576",
            "--read-ahead-bytes-max=2097152",
        ])
        .validate()
        .unwrap_err();
        assert_eq!(err.key, "read_ahead_bytes_max");
    }

    #[test]
    fn read_pieces_reach_storage_and_are_at_least_a_page() {
        let c = parse(&["--read-io-bytes-max=262144"]);
        c.validate().unwrap();
        assert_eq!(c.storage().read_io_bytes_max, 256 * 1024);
        assert_eq!(parse(&[]).storage().read_io_bytes_max, 512 * 1024);
        let err = parse(&["--read-io-bytes-max=4095"]).validate().unwrap_err();
        assert_eq!(err.key, "read_io_bytes_max");
    }

    #[test]
    fn journal_inline_writes_are_on_by_default_and_can_be_turned_off() {
        assert!(parse(&[]).journal().inline_writes);
        assert!(
            !parse(&["--journal-inline-writes=false"])
                .journal()
                .inline_writes
        );
    }

    #[test]
    fn journal_direct_io_is_on_by_default_and_can_be_turned_off() {
        assert!(parse(&[]).journal().direct_io);
        assert!(!parse(&["--journal-direct-io=false"]).journal().direct_io);
        assert!(parse(&["--journal-direct-io", "true"]).journal().direct_io);
    }

    #[test]
    fn worker_threads_are_bounded() {
        parse(&["--worker-threads=1"]).validate().unwrap();
        assert_eq!(
            parse(&["--worker-threads=1025"])
                .validate()
                .unwrap_err()
                .key,
            "worker_threads"
        );
    }

    #[test]
    fn entry_bound_must_fit_the_journal() {
        let too_big = format!(
            "--entry-bytes-max={}",
            crate::journal::RECORD_DATA_BYTES_MAX + 1
        );
        assert_eq!(
            parse(&[&too_big]).validate().unwrap_err().key,
            "entry_bytes_max"
        );
        // 4 MiB journal files cannot hold a default (5 MiB + 64 KiB) entry.
        let err = parse(&["--journal-file-bytes=4194304"])
            .validate()
            .unwrap_err();
        assert_eq!(err.key, "journal_file_bytes");
        // ... but can with a smaller entry bound.
        parse(&["--journal-file-bytes=4194304", "--entry-bytes-max=1048576"])
            .validate()
            .unwrap();
        let exact = crate::journal::file_bytes_min_for(ENTRY_BYTES_MAX_DEFAULT);
        parse(&[&format!("--journal-file-bytes={exact}")])
            .validate()
            .unwrap();
        parse(&[&format!("--journal-file-bytes={}", exact - 1)])
            .validate()
            .unwrap_err();
    }
}
