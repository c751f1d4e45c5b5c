//! Publishes ten messages and prints their ids.
//! `cargo run -p cms-client --example producer -- pulsar://127.0.0.1:6650 my-topic`

use cms_client::{Client, CompressionType, ProducerMessage};

#[tokio::main]
async fn main() -> Result<(), cms_client::Error> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "pulsar://127.0.0.1:6650".into());
    let topic = args
        .next()
        .unwrap_or_else(|| "persistent://public/default/example".into());
    let client = Client::new(url)?;
    let producer = client
        .producer(&topic)
        .batching(true)
        .compression(CompressionType::Zstd)
        .create()
        .await?;
    let mut receipts = Vec::new();
    for i in 0..10 {
        let msg = ProducerMessage::new(format!("hello {i}")).key(format!("key-{}", i % 3));
        receipts.push(producer.send_async(msg).await?);
    }
    producer.flush().await?;
    for r in receipts {
        println!("published {}", r.await?);
    }
    producer.close().await?;
    client.close().await;
    Ok(())
}
