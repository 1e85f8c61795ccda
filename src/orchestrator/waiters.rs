use std::time::Duration;

use tokio::sync::broadcast;

use crate::domain::AttemptId;

/// Wakes in-process callers waiting for another call's round on the same attempt. Waiters in
/// other processes do not hear it and fall back to polling the row, so a missed wake-up only
/// costs one poll interval.
#[derive(Clone)]
pub struct RoundNotifier {
    sender: broadcast::Sender<AttemptId>,
}

/// Rounds that may finish while a waiter looks elsewhere before it lags (and then re-reads).
const NOTIFICATIONS_BUFFERED_MAX: usize = 1024;

impl RoundNotifier {
    pub fn new() -> Self {
        Self { sender: broadcast::channel(NOTIFICATIONS_BUFFERED_MAX).0 }
    }

    pub fn round_finished(&self, id: AttemptId) {
        // No receivers is the common case, not an error.
        let _ = self.sender.send(id);
    }

    pub fn subscribe(&self) -> RoundSubscription {
        RoundSubscription { receiver: self.sender.subscribe() }
    }
}

impl Default for RoundNotifier {
    fn default() -> Self {
        Self::new()
    }
}

pub struct RoundSubscription {
    receiver: broadcast::Receiver<AttemptId>,
}

impl RoundSubscription {
    /// Returns when a round on `id` finished, when notifications were lost, or after `timeout`.
    pub async fn wait_for(&mut self, id: AttemptId, timeout: Duration) {
        let wait = async {
            loop {
                match self.receiver.recv().await {
                    Ok(finished) if finished == id => return,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}
