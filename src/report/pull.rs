//! Reads the provider's objects for a range into the run's staging: in windows of created time,
//! each paginated, one page in memory at a time. Reads are safe to repeat, so a failed call is
//! retried a bounded number of times before the run fails.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::domain::{AttemptId, PaymentSnapshot, RefundSnapshot};
use crate::provider::{CreatedRange, METADATA_ATTEMPT_ID, PaymentProvider, ProviderError};
use crate::store::{ReportStore, RunId, StagedPayment, StoreError};

use super::{ReportError, ReportSettings};

/// What one listing did, for the summary's data sources.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Listed {
    pub objects: u64,
    pub calls: u64,
}

/// Which list a page comes from (for errors and logs).
#[derive(Debug, Clone, Copy)]
pub(super) enum Listing {
    Payments,
    Refunds,
}

impl Listing {
    pub fn as_str(self) -> &'static str {
        match self {
            Listing::Payments => "payments",
            Listing::Refunds => "refunds",
        }
    }
}

pub(super) async fn pull_payments(
    provider: &Arc<dyn PaymentProvider>,
    store: &Arc<dyn ReportStore>,
    run: RunId,
    range: (DateTime<Utc>, DateTime<Utc>),
    settings: &ReportSettings,
) -> Result<Listed, ReportError> {
    let list = |window, cursor: Option<String>| async move {
        let page = provider
            .list_payments(window, cursor.as_deref(), settings.provider_page_size)
            .await?;
        Ok((page.payments, page.next_cursor))
    };
    let stage = |payments: Vec<PaymentSnapshot>| async move {
        let staged: Vec<StagedPayment<'_>> = payments
            .iter()
            .map(|payment| StagedPayment {
                payment,
                claimed_attempt: payment
                    .metadata
                    .get(METADATA_ATTEMPT_ID)
                    .and_then(|id| uuid::Uuid::parse_str(id).ok())
                    .map(AttemptId::from_uuid),
            })
            .collect();
        store.stage_payments(run, &staged).await
    };
    pull(range, settings, Listing::Payments, list, stage).await
}

pub(super) async fn pull_refunds(
    provider: &Arc<dyn PaymentProvider>,
    store: &Arc<dyn ReportStore>,
    run: RunId,
    range: (DateTime<Utc>, DateTime<Utc>),
    settings: &ReportSettings,
) -> Result<Listed, ReportError> {
    let list = |window, cursor: Option<String>| async move {
        let page = provider
            .list_refunds(window, cursor.as_deref(), settings.provider_page_size)
            .await?;
        Ok((page.refunds, page.next_cursor))
    };
    let stage =
        |refunds: Vec<RefundSnapshot>| async move { store.stage_refunds(run, &refunds).await };
    pull(range, settings, Listing::Refunds, list, stage).await
}

/// Every window of `range`, every page of each window: listed, then staged.
async fn pull<T, List, ListFuture, Stage, StageFuture>(
    range: (DateTime<Utc>, DateTime<Utc>),
    settings: &ReportSettings,
    listing: Listing,
    list: List,
    stage: Stage,
) -> Result<Listed, ReportError>
where
    List: Fn(CreatedRange, Option<String>) -> ListFuture,
    ListFuture: Future<Output = Result<(Vec<T>, Option<String>), ProviderError>>,
    Stage: Fn(Vec<T>) -> StageFuture,
    StageFuture: Future<Output = Result<(), StoreError>>,
{
    let mut listed = Listed::default();
    for window in windows(range, settings.provider_window) {
        let mut cursor: Option<String> = None;
        loop {
            let (objects, next_cursor) = with_retries(settings, listing, &mut listed, || {
                list(window, cursor.clone())
            })
            .await?;
            listed.objects += objects.len() as u64;
            if !objects.is_empty() {
                stage(objects).await?;
            }
            match next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    Ok(listed)
}

/// One list call, retried while the failure may pass; counts calls against the run's bound.
async fn with_retries<T, F, Fut>(
    settings: &ReportSettings,
    listing: Listing,
    listed: &mut Listed,
    call: F,
) -> Result<T, ReportError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, ProviderError>>,
{
    let mut backoff = settings.provider_retry_backoff;
    let mut tries = 0;
    loop {
        if listed.calls >= u64::from(settings.provider_pages_max) {
            return Err(ReportError::TooManyPages {
                listing: listing.as_str(),
                pages_max: settings.provider_pages_max,
            });
        }
        listed.calls += 1;
        tries += 1;
        match call().await {
            Ok(page) => return Ok(page),
            Err(error @ (ProviderError::OutcomeUnknown(_) | ProviderError::NotExecuted(_)))
                if tries < settings.provider_read_attempts_max =>
            {
                tracing::warn!(listing = listing.as_str(), %error, tries, "provider list failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
            }
            Err(error) => {
                return Err(ReportError::Provider {
                    listing: listing.as_str(),
                    error,
                });
            }
        }
    }
}

/// `[from, to]` cut into consecutive windows of `length`, in whole seconds (the provider's
/// resolution) and inclusive at both ends as its `created` filter is.
fn windows(
    range: (DateTime<Utc>, DateTime<Utc>),
    length: Duration,
) -> impl Iterator<Item = CreatedRange> {
    let second = Duration::seconds(1);
    let from = range.0.duration_trunc(second).unwrap_or(range.0);
    let to = range.1;
    let length = length.max(second);
    std::iter::successors(Some(from), move |start| Some(*start + length))
        .take_while(move |start| *start <= to)
        .map(move |start| CreatedRange {
            from: start,
            to: (start + length - second).min(to),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(value: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(value)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn windows_cover_the_range_without_overlap() {
        let cut: Vec<CreatedRange> = windows(
            (at("2026-12-01T00:00:00.5Z"), at("2026-12-01T02:30:00Z")),
            Duration::hours(1),
        )
        .collect();
        assert_eq!(cut.len(), 3);
        assert_eq!(cut[0].from, at("2026-12-01T00:00:00Z"));
        assert_eq!(cut[0].to, at("2026-12-01T00:59:59Z"));
        assert_eq!(cut[1].from, at("2026-12-01T01:00:00Z"));
        assert_eq!(cut[2].to, at("2026-12-01T02:30:00Z"));
    }
}
