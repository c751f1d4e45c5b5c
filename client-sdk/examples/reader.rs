//! Reads a topic from the beginning until no message is left, without a
//! subscription. `cargo run -p cms-client --example reader -- pulsar://127.0.0.1:6650 my-topic`

use cms_client::{Client, MessageId};

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
    let mut reader = client
        .reader(&topic)
        .start_message_id(MessageId::EARLIEST)
        .create()
        .await?;
    while reader.has_message_available().await? {
        let msg = reader.read_next().await?;
        println!("{} {}", msg.id, String::from_utf8_lossy(&msg.payload));
    }
    reader.close().await?;
    client.close().await;
    Ok(())
}
