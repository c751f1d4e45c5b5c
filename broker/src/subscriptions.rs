//! The subscriptions of one topic, by name (filled in when the dispatch
//! layer is wired to the connection layer).

use std::collections::HashMap;

/// The subscriptions of one topic.
#[derive(Debug, Default)]
pub struct Subscriptions {
    names: tokio::sync::Mutex<HashMap<String, ()>>,
}

impl Subscriptions {
    /// Closes every subscription (topic unload).
    pub async fn close_all(&self) {
        self.names.lock().await.clear();
    }
}
