//! Wire and metadata messages generated from `bookie/format/proto` (prost).
//! Nothing else in CMS defines these bytes (STYLE §3). The gRPC service
//! `Bookie` is generated in the bookie crate (`cms_bookie::proto::bookie`) on
//! top of these types.

/// Records stored in the metadata store (DESIGN §3).
pub mod metadata {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    include!(concat!(env!("OUT_DIR"), "/cms.metadata.v1.rs"));
}

/// The bookie wire protocol's messages (DESIGN §2).
pub mod bookie {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    include!(concat!(env!("OUT_DIR"), "/cms.bookie.v1.rs"));
}
