//! `cms-client`: the Pulsar wire codec (shared with the broker) and the Rust SDK
//! (Client, Producer, Consumer, Reader). Not built yet.
