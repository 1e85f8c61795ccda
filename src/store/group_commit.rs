//! Group commit: concurrent callers' rows go to the database as one statement and one commit,
//! the way a write-ahead log groups its flushes. This module is only the batching — who goes
//! with whom, and who hears what; the statements are the store's (`postgres_group.rs`).
//!
//! - No delay when idle: one task takes whatever is queued, so the first caller of an idle
//!   service goes at once; callers that arrive while a batch is in flight form the next one.
//!   A batch of one row runs the single-row statement, exactly what runs without group commit.
//! - Bounded: at most `batch_max` rows a statement, a queue of at most `QUEUE_BATCHES` batches
//!   (callers beyond it wait to enqueue), and an optional hold of `wait_max` for more rows,
//!   only once the service is busy (the previous batch had more than one row).
//! - Each caller hears its own answer, sent only after the statement returned (it committed):
//!   nobody calls the provider for a row that is not durable. A statement that failed as a
//!   whole (timeout, lost connection) answers every caller `Unavailable`, which callers retry;
//!   one that a row's data failed is run again row by row, so one bad row fails only itself.
//! - Two rows with the same key (one attempt's `finish_round`) never share a batch: the later
//!   one waits for the next, so it sees the first exactly as if it had run alone.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::StoreError;

/// The queue holds this many full batches at most; callers beyond it wait to enqueue.
const QUEUE_BATCHES: usize = 4;

/// The `statement` label of a batch that holds requests of more than one kind.
pub const MIXED: &str = "mixed";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitLimits {
    /// Rows in one statement at most (at least 1).
    pub batch_max: usize,
    /// How long a busy committer may hold a batch that is not full for more rows.
    pub wait_max: Duration,
}

/// Why a batch statement did not answer row by row.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Nothing of the batch committed, for a reason of the batch as a whole (statement timeout,
    /// lost connection, deadlock, pool exhausted): every caller hears "unavailable, retry".
    #[error("{0}")]
    Unavailable(String),
    /// Nothing committed, because of some row's data (a constraint, a raised error): each row is
    /// run alone, so that only the row at fault fails.
    #[error("{0}")]
    RowRejected(String),
}

/// One statement over many rows, and the same statement over one.
#[async_trait]
pub trait BatchStatement: Send + Sync + 'static {
    type Request: Send + Sync + 'static;
    type Answer: Send + 'static;

    /// The `statement` label of a request in this committer's metrics (`insert`, `finish`): a
    /// caller's wait carries its own; a batch, its requests' if they are all of one kind, else
    /// `MIXED`.
    fn kind(request: &Self::Request) -> &'static str;

    /// What makes two requests unable to share a batch (same key), if anything.
    fn key(request: &Self::Request) -> Option<Uuid>;

    /// Runs `requests` as one statement (one commit); one answer per request, in order.
    async fn run_batch(&self, requests: &[Self::Request]) -> Result<Vec<Self::Answer>, BatchError>;

    /// Runs one request alone, as it would run without group commit.
    async fn run_one(&self, request: &Self::Request) -> Result<Self::Answer, StoreError>;
}

struct Entry<S: BatchStatement> {
    request: S::Request,
    answer: oneshot::Sender<Result<S::Answer, StoreError>>,
    /// When the caller enqueued it: its wait (queue and statement) is measured from here.
    enqueued: Instant,
}

/// The callers' side of a committer task; cloning shares the task.
pub struct GroupCommitter<S: BatchStatement> {
    queue: mpsc::Sender<Entry<S>>,
}

impl<S: BatchStatement> Clone for GroupCommitter<S> {
    fn clone(&self) -> Self {
        Self { queue: self.queue.clone() }
    }
}

impl<S: BatchStatement> GroupCommitter<S> {
    /// Starts the committer task (on the current tokio runtime); it ends when every
    /// `GroupCommitter` of it is dropped.
    pub fn spawn(statement: S, limits: GroupCommitLimits) -> Self {
        assert!(limits.batch_max >= 1, "a batch holds at least one row");
        let (queue, receiver) = mpsc::channel(limits.batch_max * QUEUE_BATCHES);
        tokio::spawn(run_committer(statement, limits, receiver));
        Self { queue }
    }

    /// Enqueues `request` and waits for its own answer, given after its batch committed.
    pub async fn submit(&self, request: S::Request) -> Result<S::Answer, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Entry { request, answer, enqueued: Instant::now() })
            .await
            .map_err(|_| StoreError::Unavailable("the group committer stopped".to_owned()))?;
        answered
            .await
            .map_err(|_| StoreError::Unavailable("the group committer stopped before answering".to_owned()))?
    }
}

/// Moves entries from the front of `queue` into `batch` until it holds `batch_max`, skipping
/// (and leaving queued, in order) any whose key is already in the batch. Pure: no IO, no clock.
pub(crate) fn top_up<T>(
    batch: &mut Vec<T>,
    queue: &mut VecDeque<T>,
    batch_max: usize,
    key: impl Fn(&T) -> Option<Uuid>,
) {
    let mut skipped = VecDeque::new();
    while batch.len() < batch_max {
        let Some(entry) = queue.pop_front() else { break };
        let taken = key(&entry).is_some_and(|key_of_entry| batch.iter().any(|held| key(held) == Some(key_of_entry)));
        if taken {
            skipped.push_back(entry);
        } else {
            batch.push(entry);
        }
    }
    // What was skipped goes back in front, in its order: it is the oldest of what is left.
    while let Some(entry) = skipped.pop_back() {
        queue.push_front(entry);
    }
}

/// Takes what the channel holds right now into `queue`, at most `room` entries.
fn drain_ready<S: BatchStatement>(receiver: &mut mpsc::Receiver<Entry<S>>, queue: &mut VecDeque<Entry<S>>, room: usize) {
    for _ in 0..room {
        match receiver.try_recv() {
            Ok(entry) => queue.push_back(entry),
            Err(_) => return,
        }
    }
}

async fn run_committer<S: BatchStatement>(
    statement: S,
    limits: GroupCommitLimits,
    mut receiver: mpsc::Receiver<Entry<S>>,
) {
    let key = |entry: &Entry<S>| S::key(&entry.request);
    // Entries taken off the channel but not yet in a batch (a key already batched, or more
    // than one batch's worth): at most two batches' worth, so memory stays bounded.
    let mut queue: VecDeque<Entry<S>> = VecDeque::with_capacity(limits.batch_max * 2);
    let mut previous_batch_rows = 0;
    loop {
        if queue.is_empty() {
            // Idle: the first caller to come goes at once.
            match receiver.recv().await {
                Some(entry) => queue.push_back(entry),
                None => return,
            }
        }
        let room = (limits.batch_max * 2).saturating_sub(queue.len());
        drain_ready(&mut receiver, &mut queue, room);
        let mut batch = Vec::with_capacity(limits.batch_max);
        top_up(&mut batch, &mut queue, limits.batch_max, key);
        if previous_batch_rows > 1 && !limits.wait_max.is_zero() {
            hold_for_more(&mut receiver, &mut queue, &mut batch, limits, key).await;
        }
        previous_batch_rows = batch.len();
        commit(&statement, batch).await;
    }
}

/// Busy: keep the batch open up to `wait_max` for more rows (PostgreSQL's `commit_delay`).
async fn hold_for_more<S: BatchStatement>(
    receiver: &mut mpsc::Receiver<Entry<S>>,
    queue: &mut VecDeque<Entry<S>>,
    batch: &mut Vec<Entry<S>>,
    limits: GroupCommitLimits,
    key: impl Fn(&Entry<S>) -> Option<Uuid> + Copy,
) {
    let deadline = tokio::time::Instant::now() + limits.wait_max;
    while batch.len() < limits.batch_max {
        match tokio::time::timeout_at(deadline, receiver.recv()).await {
            Ok(Some(entry)) => {
                queue.push_back(entry);
                top_up(batch, queue, limits.batch_max, key);
            }
            Ok(None) | Err(_) => return,
        }
    }
}

/// Runs one batch and answers each of its callers; answers leave only after the statement
/// returned, so after its commit.
async fn commit<S: BatchStatement>(statement: &S, batch: Vec<Entry<S>>) {
    let rows = batch.len();
    let label = batch_label::<S>(batch.iter().map(|entry| &entry.request));
    metrics::histogram!("chargeguard_group_commit_batch_rows", "statement" => label).record(rows as f64);
    let started = Instant::now();
    if rows == 1 {
        // Alone (an idle service): the single-row statement, exactly what runs without group
        // commit, cheaper to plan than arrays of one.
        for entry in batch {
            let result = statement.run_one(&entry.request).await;
            record_statement(label, started);
            answer::<S>(entry.answer, S::kind(&entry.request), entry.enqueued, result);
        }
        return;
    }
    let (requests, callers): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|entry| (entry.request, (entry.answer, entry.enqueued))).unzip();
    let outcome = statement.run_batch(&requests).await;
    record_statement(label, started);
    match outcome {
        Ok(results) if results.len() == rows => {
            for ((request, (sender, enqueued)), result) in requests.iter().zip(callers).zip(results) {
                answer::<S>(sender, S::kind(request), enqueued, Ok(result));
            }
        }
        Ok(results) => {
            let message = format!("a batch of {rows} rows returned {} answers", results.len());
            for (request, (sender, enqueued)) in requests.iter().zip(callers) {
                answer::<S>(sender, S::kind(request), enqueued, Err(StoreError::Corrupt(message.clone())));
            }
        }
        Err(BatchError::Unavailable(message)) => {
            tracing::warn!(rows, error = %message, "group commit: the batch statement failed; every caller retries");
            for (request, (sender, enqueued)) in requests.iter().zip(callers) {
                answer::<S>(sender, S::kind(request), enqueued, Err(StoreError::Unavailable(message.clone())));
            }
        }
        Err(BatchError::RowRejected(message)) => {
            tracing::warn!(rows, error = %message, "group commit: a row failed the batch; running its rows one by one");
            for (request, (sender, enqueued)) in requests.iter().zip(callers) {
                let result = statement.run_one(request).await;
                answer::<S>(sender, S::kind(request), enqueued, result);
            }
        }
    }
}

/// A batch's `statement` label: the kind of its requests, or `MIXED`. Pure.
pub(crate) fn batch_label<'r, S: BatchStatement>(mut requests: impl Iterator<Item = &'r S::Request>) -> &'static str {
    let Some(first) = requests.next().map(S::kind) else { return MIXED };
    if requests.all(|request| S::kind(request) == first) { first } else { MIXED }
}

/// How long the batch's statement (and its commit) took, from the committer's side.
fn record_statement(label: &'static str, started: Instant) {
    metrics::histogram!("chargeguard_group_commit_statement_seconds", "statement" => label)
        .record(started.elapsed().as_secs_f64());
}

/// Answers one caller, and records how long it waited: in the queue, for the batch ahead of
/// it, and for its own statement.
fn answer<S: BatchStatement>(
    sender: oneshot::Sender<Result<S::Answer, StoreError>>,
    kind: &'static str,
    enqueued: Instant,
    result: Result<S::Answer, StoreError>,
) {
    metrics::histogram!("chargeguard_group_commit_wait_seconds", "statement" => kind)
        .record(enqueued.elapsed().as_secs_f64());
    // A caller that went away (its call was cancelled) needs no answer.
    let _ = sender.send(result);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn keyed(entries: &[(u32, Option<u128>)]) -> VecDeque<(u32, Option<u128>)> {
        entries.iter().copied().collect()
    }

    fn key_of(entry: &(u32, Option<u128>)) -> Option<Uuid> {
        entry.1.map(Uuid::from_u128)
    }

    #[test]
    fn a_batch_takes_the_queue_in_order_up_to_its_bound() {
        let mut queue = keyed(&[(1, None), (2, None), (3, None)]);
        let mut batch = Vec::new();
        top_up(&mut batch, &mut queue, 2, key_of);
        assert_eq!(batch, vec![(1, None), (2, None)]);
        assert_eq!(queue, keyed(&[(3, None)]));
    }

    #[test]
    fn a_second_row_of_the_same_key_waits_for_the_next_batch_in_its_place() {
        let mut queue = keyed(&[(1, Some(7)), (2, Some(7)), (3, Some(8)), (4, Some(7))]);
        let mut batch = Vec::new();
        top_up(&mut batch, &mut queue, 10, key_of);
        assert_eq!(batch, vec![(1, Some(7)), (3, Some(8))]);
        assert_eq!(queue, keyed(&[(2, Some(7)), (4, Some(7))]));
        let mut next = Vec::new();
        top_up(&mut next, &mut queue, 10, key_of);
        assert_eq!(next, vec![(2, Some(7))]);
    }

    /// Records each batch it runs; a request of 0 fails its batch by its data, 1000 the
    /// whole batch.
    #[derive(Clone)]
    struct Recorder {
        batches: Arc<Mutex<Vec<Vec<u32>>>>,
        release: Arc<tokio::sync::Semaphore>,
    }

    impl Default for Recorder {
        /// Runs nothing until the test adds permits.
        fn default() -> Self {
            Self { batches: Arc::default(), release: Arc::new(tokio::sync::Semaphore::new(0)) }
        }
    }

    #[async_trait]
    impl BatchStatement for Recorder {
        type Request = u32;
        type Answer = u32;

        fn kind(request: &u32) -> &'static str {
            if request.is_multiple_of(2) { "even" } else { "odd" }
        }

        fn key(_: &u32) -> Option<Uuid> {
            None
        }

        async fn run_batch(&self, requests: &[u32]) -> Result<Vec<u32>, BatchError> {
            self.release.acquire().await.unwrap().forget();
            self.batches.lock().unwrap().push(requests.to_vec());
            if requests.contains(&1000) {
                return Err(BatchError::Unavailable("timeout".into()));
            }
            if requests.contains(&0) {
                return Err(BatchError::RowRejected("bad row".into()));
            }
            Ok(requests.iter().map(|request| request * 10).collect())
        }

        async fn run_one(&self, request: &u32) -> Result<u32, StoreError> {
            self.release.acquire().await.unwrap().forget();
            self.batches.lock().unwrap().push(vec![*request]);
            if *request == 1000 {
                return Err(StoreError::Unavailable("timeout".into()));
            }
            if *request == 0 {
                return Err(StoreError::Unavailable("bad row".into()));
            }
            Ok(request * 10)
        }
    }

    #[test]
    fn a_batch_is_labelled_by_its_requests_kind_or_as_mixed() {
        assert_eq!(batch_label::<Recorder>([2, 4].iter()), "even");
        assert_eq!(batch_label::<Recorder>([3].iter()), "odd");
        assert_eq!(batch_label::<Recorder>([2, 3].iter()), MIXED);
    }

    fn limits(batch_max: usize) -> GroupCommitLimits {
        GroupCommitLimits { batch_max, wait_max: Duration::ZERO }
    }

    #[tokio::test]
    async fn an_idle_committer_sends_the_first_row_alone_and_the_rest_queue_behind_it() {
        let recorder = Recorder::default();
        let committer = GroupCommitter::spawn(recorder.clone(), limits(3));
        let mut calls = Vec::new();
        for request in 1..=5 {
            let committer = committer.clone();
            calls.push(tokio::spawn(async move { committer.submit(request).await.unwrap() }));
            tokio::task::yield_now().await;
        }
        // Let everything queue before the first statement returns.
        tokio::time::sleep(Duration::from_millis(50)).await;
        recorder.release.add_permits(10);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        assert_eq!(answers, vec![10, 20, 30, 40, 50], "each caller hears its own answer");
        let batches = recorder.batches.lock().unwrap().clone();
        assert_eq!(batches[0], vec![1], "the first caller went at once");
        assert_eq!(batches[1], vec![2, 3, 4], "those that queued meanwhile went together, bounded");
        assert_eq!(batches[2], vec![5]);
    }

    #[tokio::test]
    async fn a_failed_statement_answers_every_caller_unavailable() {
        let recorder = Recorder::default();
        recorder.release.add_permits(10);
        let committer = GroupCommitter::spawn(recorder.clone(), limits(8));
        let answer = committer.submit(1000).await;
        assert!(matches!(answer, Err(StoreError::Unavailable(_))), "{answer:?}");
        assert_eq!(committer.submit(4).await.unwrap(), 40, "the committer goes on");
    }

    #[tokio::test]
    async fn a_row_at_fault_fails_only_itself() {
        let recorder = Recorder::default();
        let committer = GroupCommitter::spawn(recorder.clone(), limits(8));
        let calls: Vec<_> = [1, 0, 2]
            .into_iter()
            .map(|request| {
                let committer = committer.clone();
                tokio::spawn(async move { committer.submit(request).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        recorder.release.add_permits(10);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap().ok());
        }
        assert_eq!(answers, vec![Some(10), None, Some(20)]);
    }
}
