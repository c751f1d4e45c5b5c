//! Wire and metadata types generated from `bookie/proto` (prost). Nothing else in
//! CMS defines these bytes (STYLE §3).

/// Records stored in the metadata store (DESIGN §3).
pub mod metadata {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    tonic::include_proto!("cms.metadata.v1");
}

/// The bookie wire protocol: service `Bookie` and its messages (DESIGN §2).
pub mod bookie {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    tonic::include_proto!("cms.bookie.v1");
}
