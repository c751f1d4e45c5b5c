//! `cms-client`: the Pulsar wire codec (shared with the broker) and the Rust SDK
//! (Client, Producer, Consumer, Reader; the SDK is not built yet).

pub mod proto;
