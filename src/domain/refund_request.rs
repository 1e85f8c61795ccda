//! A validated refund request: the refund's own operation, the charge it refunds, how much and
//! why. Pure: whether the charge exists, succeeded and has enough left is the inserting
//! statement's question (`store::AttemptStore::insert_pending_refund`), decided under the
//! charge's row lock so that concurrent refunds cannot together exceed it.

use sha2::{Digest, Sha256};

use super::{Attempt, AttemptId, Fingerprint, InvalidField, Metadata, OperationKey, RefundReason};

/// Which charge a refund gives money back from; always one of the caller's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeSelector {
    AttemptId(AttemptId),
    /// The operation's succeeded attempt (an operation may have several attempts).
    OperationKey(OperationKey),
}

/// Everything that must match when a refund operation is requested again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    pub operation_key: OperationKey,
    pub charge: ChargeSelector,
    amount_minor: Option<i64>,
    pub reason: Option<RefundReason>,
    pub metadata: Metadata,
}

impl RefundRequest {
    /// `amount_minor` absent means "what is left to refund", decided by the inserting statement.
    pub fn new(
        operation_key: OperationKey,
        charge: ChargeSelector,
        amount_minor: Option<i64>,
        reason: Option<RefundReason>,
        metadata: Metadata,
    ) -> Result<Self, InvalidField> {
        if amount_minor.is_some_and(|amount| amount <= 0) {
            return Err(InvalidField::new("amount_minor", "must be greater than 0"));
        }
        Ok(Self { operation_key, charge, amount_minor, reason, metadata })
    }

    pub fn amount_minor(&self) -> Option<i64> {
        self.amount_minor
    }

    /// A hash of the request as the caller sent it. An absent amount is encoded as absent, not
    /// as the amount it resolved to, so a redelivered "refund the rest" matches its first
    /// delivery even after other refunds changed what is left.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(b"refund.v1");
        match &self.charge {
            ChargeSelector::AttemptId(id) => {
                field(b"charge_attempt_id");
                field(id.as_uuid().as_bytes());
            }
            ChargeSelector::OperationKey(key) => {
                field(b"charge_operation_key");
                field(key.as_str().as_bytes());
            }
        }
        match self.amount_minor {
            Some(amount) => field(&amount.to_be_bytes()),
            None => field(b"\0rest"),
        }
        field(self.reason.map_or("\0none", RefundReason::as_str).as_bytes());
        field(&(self.metadata.entries().len() as u64).to_be_bytes());
        for (key, value) in self.metadata.entries() {
            field(key.as_bytes());
            field(value.as_bytes());
        }
        Fingerprint::from_stored(hex::encode(hasher.finalize()))
    }

    /// The fields in which this request differs from the stored attempt of its operation, for
    /// a mismatch error. The row keeps the resolved amount and the parent's id, not how the
    /// caller named them, so a field the row cannot tell apart is named when it may differ.
    pub fn differing_fields(&self, stored: &Attempt) -> Vec<&'static str> {
        if stored.kind != super::AttemptKind::Refund {
            return vec!["kind (the operation key names a charge)"];
        }
        let mut fields = Vec::new();
        match &self.charge {
            ChargeSelector::AttemptId(id) if stored.parent_attempt_id != Some(*id) => fields.push("charge"),
            ChargeSelector::AttemptId(_) => {}
            ChargeSelector::OperationKey(_) => fields.push("charge (or how it is named)"),
        }
        match self.amount_minor {
            Some(amount) if amount != stored.params.amount_minor => fields.push("amount_minor"),
            Some(_) => {}
            None => fields.push("amount_minor (absent here)"),
        }
        if self.reason != stored.refund_reason {
            fields.push("reason");
        }
        if self.metadata != stored.params.metadata {
            fields.push("metadata");
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(amount: Option<i64>) -> RefundRequest {
        RefundRequest::new(
            OperationKey::parse("order-1:refund-1").unwrap(),
            ChargeSelector::OperationKey(OperationKey::parse("order-1:charge").unwrap()),
            amount,
            None,
            Metadata::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_zero_or_negative_amount_names_the_field() {
        for amount in [0, -1, i64::MIN] {
            let error = RefundRequest::new(
                OperationKey::parse("r").unwrap(),
                ChargeSelector::OperationKey(OperationKey::parse("c").unwrap()),
                Some(amount),
                None,
                Metadata::default(),
            )
            .unwrap_err();
            assert_eq!(error.field, "amount_minor");
        }
    }

    #[test]
    fn fingerprint_keeps_an_absent_amount_apart_from_every_amount() {
        assert_eq!(request(None).fingerprint(), request(None).fingerprint());
        assert_ne!(request(None).fingerprint(), request(Some(1)).fingerprint());
        assert_ne!(request(Some(1)).fingerprint(), request(Some(2)).fingerprint());
        let mut reasoned = request(None);
        reasoned.reason = Some(RefundReason::Duplicate);
        assert_ne!(reasoned.fingerprint(), request(None).fingerprint());
        let mut by_id = request(None);
        by_id.charge = ChargeSelector::AttemptId(AttemptId::from_uuid(uuid::Uuid::nil()));
        assert_ne!(by_id.fingerprint(), request(None).fingerprint());
    }

    #[test]
    fn a_refund_never_shares_a_fingerprint_with_a_charge() {
        let charge = crate::domain::fixtures::pending_attempt(chrono::Utc::now());
        assert_ne!(charge.params.fingerprint(), request(Some(charge.params.amount_minor)).fingerprint());
        assert_eq!(request(None).differing_fields(&charge), vec!["kind (the operation key names a charge)"]);
    }
}
