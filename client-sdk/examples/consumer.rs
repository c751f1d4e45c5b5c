//! Receives messages as a `Stream` and acknowledges them; stops after ten.
//! `cargo run -p cms-client --example consumer -- pulsar://127.0.0.1:6650 my-topic`

use cms_client::{Client, InitialPosition, SubType};
use futures::StreamExt;

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
    let mut consumer = client
        .consumer(&topic, "example-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await?;
    let mut n = 0;
    while let Some(msg) = consumer.next().await {
        let msg = msg?;
        println!(
            "{} key={:?} payload={}",
            msg.id,
            msg.key,
            String::from_utf8_lossy(&msg.payload)
        );
        consumer.ack(&msg.id).await?;
        n += 1;
        if n == 10 {
            break;
        }
    }
    consumer.close().await?;
    client.close().await;
    Ok(())
}
