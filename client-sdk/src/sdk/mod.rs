//! The Rust SDK built on [`crate::proto`]: [`Client`], [`Producer`],
//! [`Consumer`]. See the crate documentation for a tutorial.

pub mod backoff;
pub mod client;
pub mod compression;
pub(crate) mod connection;
pub mod consumer;
#[doc(hidden)]
pub mod cost;
pub mod error;
pub mod message;
pub mod pattern;
pub mod producer;
pub mod routing;
pub(crate) mod tls;
pub mod url;
