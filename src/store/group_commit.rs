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
//! - Up to `in_flight_max` batches run at once, each on its own connection: a caller that
//!   arrives while a batch is in flight need not wait for that batch's commit before its own
//!   statement starts (PostgreSQL flushes concurrent commits together anyway). With one, a
//!   batch starts only when the one before it answered.
//! - Two rows with the same key (one attempt's `finish_round`, one operation's inserts) are
//!   never in flight in two batches at once: the later one waits until the earlier one's batch
//!   answered, so it sees the first exactly as if it had run alone, and two batches of one
//!   committer never wait on each other's row locks. Rows of one key share a batch only where
//!   the statement itself orders them (`BatchStatement::key_shares_batch`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

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
    /// Batches whose statements run at once (at least 1).
    pub in_flight_max: usize,
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

    /// The row a request writes, as a hash of its identity, if it names one: two requests of
    /// one key are never in flight in different batches at once. Two identities that share a
    /// hash only make the later request wait one batch longer.
    fn key(request: &Self::Request) -> Option<u64>;

    /// Whether requests of one key may still share a batch, because the statement itself
    /// orders them; otherwise the later one waits for the next batch.
    fn key_shares_batch(request: &Self::Request) -> bool;

    /// Runs `requests` as one statement (one commit); one answer per request, in order.
    async fn run_batch(&self, requests: &[Self::Request]) -> Result<Vec<Self::Answer>, BatchError>;

    /// Runs one request alone, as it would run without group commit.
    async fn run_one(&self, request: &Self::Request) -> Result<Self::Answer, StoreError>;
}

struct Entry<S: BatchStatement> {
    request: S::Request,
    /// `S::key` of the request, computed once by its caller: the committer compares it against
    /// every row of a batch and every key in flight.
    key: Option<u64>,
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
        assert!(limits.in_flight_max >= 1, "at least one batch runs");
        let (queue, receiver) = mpsc::channel(limits.batch_max * QUEUE_BATCHES);
        tokio::spawn(run_committer(statement, limits, receiver));
        Self { queue }
    }

    /// Enqueues `request` and waits for its own answer, given after its batch committed.
    pub async fn submit(&self, request: S::Request) -> Result<S::Answer, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Entry { key: S::key(&request), request, answer, enqueued: Instant::now() })
            .await
            .map_err(|_| StoreError::Unavailable("the group committer stopped".to_owned()))?;
        answered
            .await
            .map_err(|_| StoreError::Unavailable("the group committer stopped before answering".to_owned()))?
    }
}

/// Moves entries from the front of `queue` into `batch` until it holds `batch_max`, skipping
/// (and leaving queued, in order) any whose key is in flight in another batch, or already in
/// this one where its kind may not share. Pure: no IO, no clock.
pub(crate) fn top_up<T>(
    batch: &mut Vec<T>,
    queue: &mut VecDeque<T>,
    batch_max: usize,
    in_flight: &HashSet<u64>,
    key: impl Fn(&T) -> Option<u64>,
    shares_batch: impl Fn(&T) -> bool,
) {
    let mut skipped = VecDeque::new();
    while batch.len() < batch_max {
        let Some(entry) = queue.pop_front() else { break };
        let waits = key(&entry).is_some_and(|key_of_entry| {
            in_flight.contains(&key_of_entry)
                || (!shares_batch(&entry) && batch.iter().any(|held| key(held) == Some(key_of_entry)))
        });
        if waits {
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
    let statement = Arc::new(statement);
    let key = |entry: &Entry<S>| entry.key;
    let shares_batch = |entry: &Entry<S>| S::key_shares_batch(&entry.request);
    // Entries taken off the channel but not yet in a batch (a key in flight, or more than one
    // batch's worth): at most two batches' worth, so memory stays bounded.
    let queue_max = limits.batch_max * 2;
    let mut queue: VecDeque<Entry<S>> = VecDeque::with_capacity(queue_max);
    let mut in_flight = JoinSet::new();
    // The keys of each batch in flight, by its task, and all of them together.
    let mut keys_of_batch: HashMap<tokio::task::Id, Vec<u64>> = HashMap::new();
    let mut keys_in_flight: HashSet<u64> = HashSet::new();
    let mut previous_batch_rows = 0;
    let mut open = true;
    loop {
        while in_flight.len() < limits.in_flight_max {
            let room = queue_max.saturating_sub(queue.len());
            drain_ready(&mut receiver, &mut queue, room);
            let mut batch = Vec::with_capacity(limits.batch_max);
            top_up(&mut batch, &mut queue, limits.batch_max, &keys_in_flight, key, shares_batch);
            if batch.is_empty() {
                break;
            }
            if previous_batch_rows > 1 && !limits.wait_max.is_zero() {
                hold_for_more(&mut receiver, &mut queue, &mut batch, limits, &keys_in_flight, key, shares_batch).await;
            }
            previous_batch_rows = batch.len();
            let keys: Vec<u64> = batch.iter().filter_map(key).collect();
            keys_in_flight.extend(keys.iter().copied());
            let task = in_flight.spawn(commit(statement.clone(), batch));
            keys_of_batch.insert(task.id(), keys);
        }
        if !open && queue.is_empty() && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            Some(done) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                // A batch task that panicked dropped its callers' answers: they hear
                // "unavailable". Its keys are free either way.
                let task = match done {
                    Ok((task, ())) => task,
                    Err(error) => error.id(),
                };
                for done_key in keys_of_batch.remove(&task).unwrap_or_default() {
                    keys_in_flight.remove(&done_key);
                }
            }
            entry = receiver.recv(), if open && queue.len() < queue_max => match entry {
                Some(entry) => queue.push_back(entry),
                None => open = false,
            },
            else => return,
        }
    }
}

/// Busy: keep the batch open up to `wait_max` for more rows (PostgreSQL's `commit_delay`).
async fn hold_for_more<S: BatchStatement>(
    receiver: &mut mpsc::Receiver<Entry<S>>,
    queue: &mut VecDeque<Entry<S>>,
    batch: &mut Vec<Entry<S>>,
    limits: GroupCommitLimits,
    keys_in_flight: &HashSet<u64>,
    key: impl Fn(&Entry<S>) -> Option<u64> + Copy,
    shares_batch: impl Fn(&Entry<S>) -> bool + Copy,
) {
    let deadline = tokio::time::Instant::now() + limits.wait_max;
    while batch.len() < limits.batch_max {
        match tokio::time::timeout_at(deadline, receiver.recv()).await {
            Ok(Some(entry)) => {
                queue.push_back(entry);
                top_up(batch, queue, limits.batch_max, keys_in_flight, key, shares_batch);
            }
            Ok(None) | Err(_) => return,
        }
    }
}

/// Runs one batch and answers each of its callers; answers leave only after the statement
/// returned, so after its commit.
async fn commit<S: BatchStatement>(statement: Arc<S>, batch: Vec<Entry<S>>) {
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

    fn keyed(entries: &[(u32, Option<u64>)]) -> VecDeque<(u32, Option<u64>)> {
        entries.iter().copied().collect()
    }

    fn key_of(entry: &(u32, Option<u64>)) -> Option<u64> {
        entry.1
    }

    fn never_shares(_: &(u32, Option<u64>)) -> bool {
        false
    }

    /// Entries numbered 100 and up share a batch with their key.
    fn shares_from_100(entry: &(u32, Option<u64>)) -> bool {
        entry.0 >= 100
    }

    #[test]
    fn a_batch_takes_the_queue_in_order_up_to_its_bound() {
        let mut queue = keyed(&[(1, None), (2, None), (3, None)]);
        let mut batch = Vec::new();
        top_up(&mut batch, &mut queue, 2, &HashSet::new(), key_of, never_shares);
        assert_eq!(batch, vec![(1, None), (2, None)]);
        assert_eq!(queue, keyed(&[(3, None)]));
    }

    #[test]
    fn a_second_row_of_the_same_key_waits_for_the_next_batch_in_its_place() {
        let mut queue = keyed(&[(1, Some(7)), (2, Some(7)), (3, Some(8)), (4, Some(7))]);
        let mut batch = Vec::new();
        top_up(&mut batch, &mut queue, 10, &HashSet::new(), key_of, never_shares);
        assert_eq!(batch, vec![(1, Some(7)), (3, Some(8))]);
        assert_eq!(queue, keyed(&[(2, Some(7)), (4, Some(7))]));
        let mut next = Vec::new();
        top_up(&mut next, &mut queue, 10, &HashSet::new(), key_of, never_shares);
        assert_eq!(next, vec![(2, Some(7))]);
    }

    #[test]
    fn rows_whose_kind_shares_a_batch_go_together_but_never_beside_their_key_in_flight() {
        let mut queue = keyed(&[(100, Some(7)), (101, Some(7)), (1, Some(7)), (102, Some(9)), (2, None)]);
        let mut batch = Vec::new();
        top_up(&mut batch, &mut queue, 10, &HashSet::new(), key_of, shares_from_100);
        assert_eq!(batch, vec![(100, Some(7)), (101, Some(7)), (102, Some(9)), (2, None)]);
        assert_eq!(queue, keyed(&[(1, Some(7))]), "a row that may not share waits for the next batch");

        let mut queue = keyed(&[(100, Some(7)), (1, Some(8)), (2, None), (101, Some(9))]);
        let mut next = Vec::new();
        top_up(&mut next, &mut queue, 10, &HashSet::from([7, 8]), key_of, shares_from_100);
        assert_eq!(next, vec![(2, None), (101, Some(9))], "keys in flight in another batch wait, whatever their kind");
        assert_eq!(queue, keyed(&[(100, Some(7)), (1, Some(8))]));
    }

    /// Records each batch as it starts, then runs it when the test releases it; a request of
    /// 0 fails its batch by its data, 1000 the whole batch. Requests of 100 and up are keyed by
    /// their hundreds.
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

        fn key(request: &u32) -> Option<u64> {
            (*request >= 100).then_some(u64::from(*request / 100))
        }

        fn key_shares_batch(_: &u32) -> bool {
            false
        }

        async fn run_batch(&self, requests: &[u32]) -> Result<Vec<u32>, BatchError> {
            self.batches.lock().unwrap().push(requests.to_vec());
            self.release.acquire().await.unwrap().forget();
            if requests.contains(&1000) {
                return Err(BatchError::Unavailable("timeout".into()));
            }
            if requests.contains(&0) {
                return Err(BatchError::RowRejected("bad row".into()));
            }
            Ok(requests.iter().map(|request| request * 10).collect())
        }

        async fn run_one(&self, request: &u32) -> Result<u32, StoreError> {
            self.batches.lock().unwrap().push(vec![*request]);
            self.release.acquire().await.unwrap().forget();
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
        GroupCommitLimits { batch_max, wait_max: Duration::ZERO, in_flight_max: 1 }
    }

    /// Submits each request from its own task, in order, letting each reach the queue.
    async fn submit_each(committer: &GroupCommitter<Recorder>, requests: &[u32]) -> Vec<tokio::task::JoinHandle<Result<u32, StoreError>>> {
        let mut calls = Vec::new();
        for &request in requests {
            let committer = committer.clone();
            calls.push(tokio::spawn(async move { committer.submit(request).await }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        calls
    }

    #[tokio::test]
    async fn a_second_batch_starts_while_the_first_is_in_flight_but_never_with_a_key_of_it() {
        let recorder = Recorder::default();
        let committer = GroupCommitter::spawn(recorder.clone(), GroupCommitLimits { in_flight_max: 2, ..limits(8) });
        // 101 goes alone and is held; 102 (its key) and 3 arrive while it is in flight.
        let calls = submit_each(&committer, &[101, 102, 3]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            recorder.batches.lock().unwrap().clone(),
            vec![vec![101], vec![3]],
            "the second batch started before the first answered, without the first's key"
        );
        recorder.release.add_permits(1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        recorder.release.add_permits(10);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap().unwrap());
        }
        assert_eq!(answers, vec![1010, 1020, 30]);
        assert_eq!(recorder.batches.lock().unwrap()[2], vec![102], "the key's next row went once its batch answered");
    }

    #[tokio::test]
    async fn with_one_batch_in_flight_the_next_starts_only_when_it_answered() {
        let recorder = Recorder::default();
        let committer = GroupCommitter::spawn(recorder.clone(), limits(8));
        let calls = submit_each(&committer, &[1, 2, 3]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(recorder.batches.lock().unwrap().clone(), vec![vec![1]]);
        recorder.release.add_permits(10);
        for call in calls {
            call.await.unwrap().unwrap();
        }
        assert_eq!(recorder.batches.lock().unwrap().clone(), vec![vec![1], vec![2, 3]]);
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
