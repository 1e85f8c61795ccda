//! Reads of a consumer's own attempts.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::DateTime;
use uuid::Uuid;

use super::{Orchestrator, OrchestratorError};
use crate::domain::{Attempt, AttemptId, ConsumerName, OperationKey};
use crate::store::{ListCursor, ListFilter};

pub enum AttemptSelector {
    Id(AttemptId),
    OperationKey(OperationKey),
}

pub struct AttemptPage {
    pub attempts: Vec<Attempt>,
    pub next_page_token: Option<String>,
}

impl Orchestrator {
    /// Another consumer's attempt is reported as absent, never as forbidden: its existence is
    /// not the caller's business.
    pub async fn get_attempt(
        &self,
        consumer: &ConsumerName,
        selector: AttemptSelector,
    ) -> Result<Attempt, OrchestratorError> {
        let found = match selector {
            AttemptSelector::Id(id) => self.store.find_by_id(Some(consumer), id).await?,
            AttemptSelector::OperationKey(key) => self.store.find_by_operation(consumer, &key).await?,
        };
        found.ok_or(OrchestratorError::NotFound)
    }

    /// How many attempts the attempt's operation has (the attempt among them).
    pub async fn operation_attempts(&self, consumer: &ConsumerName, attempt: &Attempt) -> Result<u32, OrchestratorError> {
        Ok(self.store.count_operation_attempts(consumer, &attempt.operation_key).await?)
    }

    /// `page_size` was checked against the maximum by the caller.
    pub async fn list_attempts(
        &self,
        consumer: &ConsumerName,
        filter: &ListFilter,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<AttemptPage, OrchestratorError> {
        let after = page_token.map(decode_cursor).transpose()?;
        // One extra row tells whether another page follows without a second query.
        let mut attempts = self.store.list(consumer, filter, after, page_size + 1).await?;
        let next_page_token = if attempts.len() > page_size as usize {
            attempts.truncate(page_size as usize);
            attempts.last().map(|last| encode_cursor(ListCursor { created_at: last.created_at, id: last.id }))
        } else {
            None
        };
        Ok(AttemptPage { attempts, next_page_token })
    }
}

fn encode_cursor(cursor: ListCursor) -> String {
    let text = format!("{}|{}", cursor.created_at.timestamp_micros(), cursor.id);
    URL_SAFE_NO_PAD.encode(text)
}

fn decode_cursor(token: &str) -> Result<ListCursor, OrchestratorError> {
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| OrchestratorError::InvalidPageToken)?;
    let text = String::from_utf8(bytes).map_err(|_| OrchestratorError::InvalidPageToken)?;
    let (micros, id) = text.split_once('|').ok_or(OrchestratorError::InvalidPageToken)?;
    let micros: i64 = micros.parse().map_err(|_| OrchestratorError::InvalidPageToken)?;
    let created_at =
        DateTime::from_timestamp_micros(micros).ok_or(OrchestratorError::InvalidPageToken)?;
    let id = Uuid::parse_str(id).map_err(|_| OrchestratorError::InvalidPageToken)?;
    Ok(ListCursor { created_at, id: AttemptId::from_uuid(id) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let cursor = ListCursor {
            created_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap(),
            id: AttemptId::from_uuid(Uuid::now_v7()),
        };
        assert_eq!(decode_cursor(&encode_cursor(cursor)).unwrap(), cursor);
        assert!(decode_cursor("not base64 !").is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("12|nope")).is_err());
    }
}
