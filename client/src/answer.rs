//! What a call means for the consumer: done, retry later, or reject.

use std::fmt;
use std::time::Duration;

/// The classified answer of one call (or of a `*_until_decided` loop).
#[derive(Clone, Debug, PartialEq)]
pub enum Answer<T> {
    /// The server answered. For a charge or refund the attempt is in the response (a decline
    /// is a `Done` with a failed attempt, not an error).
    Done(T),
    /// Nothing was lost and nothing is wrong with the request: call again with the same
    /// request, no sooner than [`RetryLater::after`].
    RetryLater(RetryLater),
    /// The same request will be refused again: do not retry it (dead-letter it).
    Reject(Rejection),
}

impl<T> Answer<T> {
    /// The response, when the call is done.
    pub fn done(self) -> Option<T> {
        match self {
            Answer::Done(response) => Some(response),
            Answer::RetryLater(_) | Answer::Reject(_) => None,
        }
    }
}

impl<T> From<Classification> for Answer<T> {
    fn from(classification: Classification) -> Self {
        match classification {
            Classification::RetryLater(later) => Answer::RetryLater(later),
            Classification::Reject(rejection) => Answer::Reject(rejection),
        }
    }
}

/// What an error status means: retry the same request later, or never.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classification {
    RetryLater(RetryLater),
    Reject(Rejection),
}

/// A call to repeat, with the same request, later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryLater {
    /// The server's hint (`chargeguard-retry-after-ms`, else `retry-after` seconds), or zero:
    /// wait at least this long.
    pub after: Duration,
    pub class: RetryClass,
    /// The server's `chargeguard-error-code`, or, when the server sent none (the error never
    /// reached it), the gRPC code's name (e.g. `"unavailable"`).
    pub code: String,
    pub message: String,
}

/// Why a call is to be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryClass {
    /// The provider's answer is not known; the attempt stays pending and is completed by the
    /// next call or by the server's sweep.
    OutcomeUnknown,
    /// Another call is deciding the same attempt (or an earlier attempt of the operation).
    InProgress,
    /// The server (its database, or the provider for a report) is unavailable.
    Unavailable,
    /// The call's deadline expired before an answer arrived.
    DeadlineExceeded,
    /// The caller is over its rate or its calls in flight.
    ResourceExhausted,
    /// The call never got an answer from a server (connection refused or reset, no status).
    Transport,
}

impl RetryClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RetryClass::OutcomeUnknown => "outcome_unknown",
            RetryClass::InProgress => "in_progress",
            RetryClass::Unavailable => "unavailable",
            RetryClass::DeadlineExceeded => "deadline_exceeded",
            RetryClass::ResourceExhausted => "resource_exhausted",
            RetryClass::Transport => "transport",
        }
    }
}

impl fmt::Display for RetryClass {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl fmt::Display for RetryLater {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "retry later ({}, {}, after {} ms): {}", self.class, self.code, self.after.as_millis(), self.message)
    }
}

/// A request the server refused and will refuse again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub grpc_code: tonic::Code,
    /// The server's `chargeguard-error-code`, or, when it sent none, the gRPC code's name.
    pub code: String,
    pub message: String,
    /// `chargeguard-attempt-id`: the attempt the refusal is about, when there is one.
    pub attempt_id: Option<String>,
}

impl fmt::Display for Rejection {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "rejected ({}): {}", self.code, self.message)
    }
}
