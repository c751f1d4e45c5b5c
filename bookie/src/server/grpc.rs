//! The gRPC face of the bookie: the `Bookie` service of
//! `proto/cms/bookie/v1/bookie.proto` over [`BookieCore`].
//!
//! Promises:
//! - every call must name this bookie and incarnation in the headers
//!   [`BOOKIE_ID_HEADER`] / [`INCARNATION_HEADER`], else `FAILED_PRECONDITION`;
//! - the add stream answers out of order by request id; at most
//!   `adds_in_flight_per_stream_max` adds are in flight on one stream, an add
//!   over that bound is answered `TOO_MANY_REQUESTS` at once and the stream goes
//!   on; a bad add (oversized, malformed) is answered `BAD_REQUEST` and the
//!   stream goes on (tonic's own message limit is set well above the entry
//!   limit, see [`GRPC_MESSAGE_BYTES_MAX`], because a tonic size error ends the
//!   whole stream);
//! - every storage read (single and range) is admitted by the weighted fair
//!   scheduler [`FairReads`] keyed by the request's opaque `fairness_key`
//!   (deficit round robin by bytes, per-key queues bounded in requests and
//!   bytes, docs/isolation.md): one key's catch-up reads cannot take every
//!   read slot nor delay another key's small reads by more than a round; a
//!   read whose key's queue is full is answered `TOO_MANY_REQUESTS` at once.
//!   Reads never touch the add path: adds go from the stream to the journal
//!   without waiting on any read slot; storage reads run on the blocking pool.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::add_stream::AddPipeline;
use super::core::{AddOp, BookieCore, ReadResult};
use crate::fair::{FairMetrics, FairReads, SchedConfig};
use crate::fs::{DiskSpace, SharedFs};
use crate::proto::bookie::bookie_server::Bookie;
use crate::proto::bookie::{
    AddFlag, AddRequest, AddResponse, GetBookieInfoRequest, GetBookieInfoResponse, ReadFlag,
    ReadLacRequest, ReadLacResponse, ReadNextRequest, ReadNextResponse, ReadRangeRequest,
    ReadRangeResponse, ReadRequest, ReadResponse, StatusCode, WriteLacRequest, WriteLacResponse,
};

/// Header naming the bookie a call is meant for.
pub const BOOKIE_ID_HEADER: &str = "x-cms-bookie-id";
/// Header naming the incarnation a call is meant for.
pub const INCARNATION_HEADER: &str = "x-cms-bookie-incarnation";
/// tonic's per-message limit on both sides: above the entry limit plus the
/// envelope and above the read-response bound.
pub const GRPC_MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bounds of the gRPC layer.
#[derive(Debug, Clone)]
pub struct GrpcLimits {
    /// Adds in flight on one add stream.
    pub adds_in_flight_per_stream_max: usize,
    /// The read scheduler: slots, per-key bounds, weights.
    pub reads: SchedConfig,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            adds_in_flight_per_stream_max: 10_000,
            reads: SchedConfig::default(),
        }
    }
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct BookieService {
    core: Arc<BookieCore>,
    bookie_id: String,
    incarnation: u64,
    limits: GrpcLimits,
    reads: Arc<FairReads>,
    disk: DiskProbe,
    draining: tokio::sync::watch::Receiver<bool>,
}

/// Reads the space of the file system holding the ledger directory.
#[derive(Debug, Clone)]
pub struct DiskProbe {
    fs: SharedFs,
    path: PathBuf,
}

impl DiskProbe {
    /// A probe of the file system holding `path`.
    pub fn new(fs: SharedFs, path: PathBuf) -> Self {
        DiskProbe { fs, path }
    }

    /// The space, or an error.
    pub fn space(&self) -> std::io::Result<DiskSpace> {
        self.fs.space(&self.path)
    }
}

fn status_i32(s: StatusCode) -> i32 {
    s as i32
}

impl BookieService {
    /// A service for bookie `bookie_id` / `incarnation`; when `draining` turns
    /// true, add streams stop reading, answer what is pending and end.
    pub fn new(
        core: Arc<BookieCore>,
        bookie_id: String,
        incarnation: u64,
        limits: GrpcLimits,
        read_metrics: FairMetrics,
        disk: DiskProbe,
        draining: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let reads = Arc::new(FairReads::new(limits.reads.clone(), read_metrics));
        BookieService {
            core,
            bookie_id,
            incarnation,
            limits,
            reads,
            disk,
            draining,
        }
    }

    fn check_target<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let md = req.metadata();
        let id = md.get(BOOKIE_ID_HEADER).and_then(|v| v.to_str().ok());
        let inc = md
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        match (id, inc) {
            (Some(id), Some(inc)) if id == self.bookie_id && inc == self.incarnation => Ok(()),
            (Some(id), Some(inc)) => Err(Status::failed_precondition(format!(
                "this is bookie {} incarnation {}, not {id} incarnation {inc}",
                self.bookie_id, self.incarnation
            ))),
            _ => Err(Status::failed_precondition(format!(
                "missing or malformed {BOOKIE_ID_HEADER} / {INCARNATION_HEADER} headers"
            ))),
        }
    }

    async fn read_one(&self, ledger_id: u64, entry_id: i64, key: &str) -> ReadResult {
        let mut permit = match self.reads.admit(key, 1, 0).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(ledger = ledger_id, entry = entry_id, error = %e, "read refused");
                return ReadResult {
                    status: StatusCode::TooManyRequests,
                    body: Bytes::new(),
                };
            }
        };
        let core = self.core.clone();
        let r = tokio::task::spawn_blocking(move || core.read_entry(ledger_id, entry_id))
            .await
            .unwrap_or(ReadResult {
                status: StatusCode::IoError,
                body: Bytes::new(),
            });
        permit.set_bytes(r.body.len() as u64);
        r
    }
}

/// Counts one add in the in-flight gauge for as long as it lives (an add
/// dropped unanswered, with its stream, is uncounted too).
struct InFlight<'a>(&'a prometheus::IntGauge);

impl<'a> InFlight<'a> {
    fn new(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

type AddStream = Pin<Box<dyn Stream<Item = Result<AddResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Bookie for BookieService {
    type AddStream = AddStream;

    async fn add(
        &self,
        request: Request<Streaming<AddRequest>>,
    ) -> Result<Response<AddStream>, Status> {
        self.check_target(&request)?;
        let inbound = request.into_inner();
        let in_flight_max = self.limits.adds_in_flight_per_stream_max.max(1);
        let core = self.core.clone();
        let mut draining = self.draining.clone();
        if *draining.borrow_and_update() {
            return Err(Status::unavailable("bookie is shutting down"));
        }
        let start = move |req: AddRequest| {
            let core = core.clone();
            let recovery = req.flags & (AddFlag::RecoveryAdd as u32) != 0;
            let (request_id, ledger_id, entry_id) = (req.request_id, req.ledger_id, req.entry_id);
            let op = AddOp {
                ledger_id,
                entry_id,
                master_key: req.master_key,
                recovery,
                body: req.body,
            };
            async move {
                let _in_flight = InFlight::new(&core.metrics().adds_in_flight);
                let status = core.add(op).await;
                Ok(AddResponse {
                    request_id,
                    status: status_i32(status),
                    ledger_id,
                    entry_id,
                })
            }
        };
        let refuse = |req: AddRequest| {
            Ok(AddResponse {
                request_id: req.request_id,
                status: status_i32(StatusCode::TooManyRequests),
                ledger_id: req.ledger_id,
                entry_id: req.entry_id,
            })
        };
        let pipeline = AddPipeline::new(inbound, draining, in_flight_max, start, refuse);
        Ok(Response::new(Box::pin(pipeline)))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        self.check_target(&request)?;
        let req = request.into_inner();
        let fence = req.flags & (ReadFlag::Fence as u32) != 0;
        if fence {
            let s = self.core.fence(req.ledger_id, &req.master_key).await;
            if s != StatusCode::Ok || req.entry_id < 0 {
                return Ok(Response::new(ReadResponse {
                    status: status_i32(s),
                    ledger_id: req.ledger_id,
                    entry_id: req.entry_id,
                    body: Bytes::new(),
                }));
            }
        }
        if req.entry_id < 0 {
            return Ok(Response::new(ReadResponse {
                status: status_i32(StatusCode::BadRequest),
                ledger_id: req.ledger_id,
                entry_id: req.entry_id,
                body: Bytes::new(),
            }));
        }
        let r = self
            .read_one(req.ledger_id, req.entry_id, &req.fairness_key)
            .await;
        Ok(Response::new(ReadResponse {
            status: status_i32(r.status),
            ledger_id: req.ledger_id,
            entry_id: req.entry_id,
            body: r.body,
        }))
    }

    async fn read_range(
        &self,
        request: Request<ReadRangeRequest>,
    ) -> Result<Response<ReadRangeResponse>, Status> {
        self.check_target(&request)?;
        let req = request.into_inner();
        let fence = req.flags & (ReadFlag::Fence as u32) != 0;
        let key = fence.then_some(&req.master_key);
        let mut permit = match self
            .reads
            .admit(&req.fairness_key, req.count_max.max(1), req.bytes_max)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(ledger = req.ledger_id, error = %e, "range read refused");
                return Ok(Response::new(ReadRangeResponse {
                    status: status_i32(StatusCode::TooManyRequests),
                    ledger_id: req.ledger_id,
                    first_entry_id: req.first_entry_id,
                    bodies: Vec::new(),
                }));
            }
        };
        let (status, bodies) = self
            .core
            .read_range(
                req.ledger_id,
                req.first_entry_id,
                req.count_max as usize,
                req.bytes_max.min(usize::MAX as u64) as usize,
                key,
            )
            .await;
        permit.set_bytes(bodies.iter().map(|b| b.len() as u64).sum());
        drop(permit);
        Ok(Response::new(ReadRangeResponse {
            status: status_i32(status),
            ledger_id: req.ledger_id,
            first_entry_id: req.first_entry_id,
            bodies,
        }))
    }

    async fn read_next(
        &self,
        request: Request<ReadNextRequest>,
    ) -> Result<Response<ReadNextResponse>, Status> {
        self.check_target(&request)?;
        let req = request.into_inner();
        let (status, lac, body) = self
            .core
            .read_next(
                req.ledger_id,
                req.previous_lac,
                Duration::from_millis(u64::from(req.timeout_ms)),
            )
            .await;
        Ok(Response::new(ReadNextResponse {
            status: status_i32(status),
            ledger_id: req.ledger_id,
            lac,
            entry_id: req.previous_lac.saturating_add(1),
            body,
        }))
    }

    async fn read_lac(
        &self,
        request: Request<ReadLacRequest>,
    ) -> Result<Response<ReadLacResponse>, Status> {
        self.check_target(&request)?;
        let req = request.into_inner();
        let (status, lac_body, last_entry_body) = self.core.read_lac(req.ledger_id);
        Ok(Response::new(ReadLacResponse {
            status: status_i32(status),
            ledger_id: req.ledger_id,
            lac_body,
            last_entry_body,
        }))
    }

    async fn write_lac(
        &self,
        request: Request<WriteLacRequest>,
    ) -> Result<Response<WriteLacResponse>, Status> {
        self.check_target(&request)?;
        let req = request.into_inner();
        let status = self
            .core
            .write_lac(req.ledger_id, &req.master_key, req.lac, req.body)
            .await;
        Ok(Response::new(WriteLacResponse {
            status: status_i32(status),
            ledger_id: req.ledger_id,
        }))
    }

    async fn get_bookie_info(
        &self,
        request: Request<GetBookieInfoRequest>,
    ) -> Result<Response<GetBookieInfoResponse>, Status> {
        self.check_target(&request)?;
        let (total_bytes, free_bytes) = self
            .disk
            .space()
            .map(|s| (s.total_bytes, s.available_bytes))
            .unwrap_or((0, 0));
        Ok(Response::new(GetBookieInfoResponse {
            bookie_id: self.bookie_id.clone(),
            incarnation: self.incarnation,
            writable: self.core.mode() == super::core::BookieMode::Writable,
            total_bytes,
            free_bytes,
        }))
    }
}
