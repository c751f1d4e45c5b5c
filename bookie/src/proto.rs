//! Wire and metadata types generated from `bookie/format/proto` (prost; the
//! messages live in `cms-bookie-format`, re-exported here). Nothing else in
//! CMS defines these bytes (STYLE §3).

/// Records stored in the metadata store (DESIGN §3).
pub use cms_bookie_format::proto::metadata;

/// The bookie wire protocol: service `Bookie` and its messages (DESIGN §2).
pub mod bookie {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    pub use cms_bookie_format::proto::bookie::*;
    tonic::include_proto!("cms.bookie.v1");
}
