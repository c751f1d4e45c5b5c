//! `cms-client`: the Pulsar wire codec (shared with the broker, [`proto`])
//! and the Rust SDK: [`Client`], [`Producer`], [`Consumer`].
//!
//! # Tutorial
//!
//! Publish, subscribe, acknowledge:
//!
//! ```no_run
//! use cms_client::{Client, CompressionType, InitialPosition, ProducerMessage, SubType};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), cms_client::Error> {
//! // One client per application: it shares one connection per broker.
//! let client = Client::builder("pulsar://localhost:6650")
//!     .operation_timeout(Duration::from_secs(10))
//!     .build()?;
//!
//! // Subscribe first so the subscription sees what follows.
//! let mut consumer = client
//!     .consumer("persistent://public/default/orders", "billing")
//!     .sub_type(SubType::Shared)
//!     .initial_position(InitialPosition::Earliest)
//!     .subscribe()
//!     .await?;
//!
//! // A producer with batching and LZ4 compression.
//! let producer = client
//!     .producer("persistent://public/default/orders")
//!     .batching(true)
//!     .compression(CompressionType::Lz4)
//!     .create()
//!     .await?;
//!
//! // `send` waits for the broker's receipt and returns the message id.
//! let id = producer
//!     .send(ProducerMessage::new("order 1").key("customer-7").property("source", "web"))
//!     .await?;
//! println!("published as {id}");
//!
//! // `send_async` returns once queued; await the receipt later.
//! let receipt = producer.send_async("order 2").await?;
//! receipt.await?;
//!
//! for _ in 0..2 {
//!     let msg = consumer.receive().await?;
//!     println!("got {:?} (redelivered {} times)", msg.payload, msg.redelivery_count);
//!     consumer.ack(&msg.id).await?;
//! }
//! producer.close().await?;
//! consumer.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! A [`Consumer`] is also a `futures::Stream` of `Result<Message>`.
//!
//! # Several topics, patterns, retry later
//!
//! ```no_run
//! use cms_client::{Client, SubType};
//! use std::time::Duration;
//!
//! # async fn run(client: Client) -> Result<(), cms_client::Error> {
//! // One consumer over a list of topics; each message carries its topic.
//! let mut all = client
//!     .consumer_topics(["persistent://public/default/a", "persistent://public/default/b"], "audit")
//!     .subscribe()
//!     .await?;
//! let msg = all.receive().await?;
//! println!("{} from {}", msg.id, msg.topic);
//! all.ack(&msg.id).await?; // goes to the topic it came from
//!
//! // Every topic of the namespace matching a regex, rediscovered every 10 s.
//! let _orders = client
//!     .consumer_pattern("persistent://public/default/orders-.*", "billing")
//!     .pattern_auto_discovery_period(Duration::from_secs(10))
//!     .subscribe()
//!     .await?;
//!
//! // Retry later through `<topic>-<subscription>-RETRY`; after 3 retries
//! // the message goes to `<topic>-<subscription>-DLQ`.
//! let mut jobs = client
//!     .consumer("persistent://public/default/jobs", "workers")
//!     .sub_type(SubType::Shared) // delays need Shared or Key_Shared
//!     .enable_retry(true)
//!     .dead_letter(3, None)
//!     .subscribe()
//!     .await?;
//! let job = jobs.receive().await?;
//! jobs.reconsume_later(&job, Duration::from_secs(30)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # TLS and token authentication
//!
//! ```no_run
//! # fn run() -> Result<(), cms_client::Error> {
//! // Several hosts, TLS, the brokers' CA and a token (Pulsar's settings:
//! // tlsTrustCertsFilePath, tlsValidateHostname, AuthenticationToken).
//! let client = cms_client::Client::builder("pulsar+ssl://b1.example:6651,b2.example:6651")
//!     .tls_trust_certs_file("/etc/cms/ca.pem")
//!     .tls_validate_hostname(true) // the default
//!     .auth_token(std::fs::read_to_string("app.token").unwrap_or_default().trim())
//!     .build()?;
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//! Lookups then follow the brokers' `brokerServiceUrlTls`; a broker whose
//! certificate is not trusted, or does not name the host, is
//! [`Error::Tls`] (not retried).
//!
//! # Features
//! - `sdk` (default): the SDK and `cms-perf`. With `default-features = false`
//!   the crate is only the wire codec [`proto`] (bytes, prost, crc32c,
//!   tokio-util): what the broker's codec users and the fuzz targets need.
//!
//! # Promises
//! - Nothing panics on bad server input: it is an [`Error`].
//! - Every queue is bounded: the producer's pending messages
//!   (`max_pending_messages`), the consumer's receiver queue, requests per
//!   connection, frames per connection.
//! - Producers and consumers survive a broker restart: they reconnect with
//!   backoff; producers resend unacknowledged messages with their original
//!   sequence ids.

pub mod proto;
#[cfg(feature = "sdk")]
pub mod sdk;

pub use proto::pulsar::CompressionType;
pub use proto::pulsar::ProducerAccessMode;
pub use proto::pulsar::ServerError;
pub use proto::pulsar::command_subscribe::{InitialPosition, SubType};
#[cfg(feature = "sdk")]
pub use sdk::client::{Client, ClientBuilder};
#[cfg(feature = "sdk")]
pub use sdk::consumer::{BatchReceivePolicy, Consumer, ConsumerBuilder, Reader, ReaderBuilder};
#[cfg(feature = "sdk")]
pub use sdk::error::{Error, Result};
#[cfg(feature = "sdk")]
pub use sdk::message::{Message, MessageId, ProducerMessage};
#[cfg(feature = "sdk")]
pub use sdk::pattern::PatternMode;
#[cfg(feature = "sdk")]
pub use sdk::producer::{Producer, ProducerBuilder, SendFuture};
#[cfg(feature = "sdk")]
pub use sdk::routing::RoutingMode;
