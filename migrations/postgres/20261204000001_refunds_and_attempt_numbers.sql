-- Issues 15 and 16: refunds are attempts of their own, and an operation may have several
-- attempts (a new one only after every earlier one is known not to have charged).
--
-- * kind 'refund': a refund's row, with parent_attempt_id naming the charge it refunds and
--   refund_reason Stripe's reason. Its operation key is the refund's own business identity
--   (`order-1234:refund-1`) in the same namespace as charges' keys, so one key never names a
--   charge and a refund at once (their fingerprints differ: the second is a mismatch).
-- * An operation's attempts are its generations: attempt n is generation n - 1, and each has
--   its own derived key. The operation is unique per generation; the generation rule (a new one
--   only after a provider-confirmed terminal failure) is kept by the inserting statement.
-- * confirms_payment_id: the provider object of an earlier attempt that this attempt confirms
--   again with its own key and payment method (a declined PaymentIntent can still be paid, so
--   a new one beside it could make two charges). NULL when the attempt creates its own object.
-- * failed_after_success_at: a refund the provider reported failed after it had succeeded
--   (the money went back to the merchant): the one move out of succeeded, refunds only.
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_kind_check;
ALTER TABLE payment_attempts
    ADD CONSTRAINT payment_attempts_kind_check CHECK (kind IN ('charge', 'refund')),
    ADD COLUMN parent_attempt_id UUID REFERENCES payment_attempts (id),
    ADD COLUMN refund_reason TEXT
        CHECK (refund_reason IN ('duplicate', 'fraudulent', 'requested_by_customer')),
    ADD COLUMN confirms_payment_id TEXT,
    ADD COLUMN failed_after_success_at TIMESTAMPTZ,
    ADD CONSTRAINT payment_attempts_refund_parent
        CHECK ((kind = 'refund') = (parent_attempt_id IS NOT NULL)),
    ADD CONSTRAINT payment_attempts_refund_reason_only_on_refunds
        CHECK (refund_reason IS NULL OR kind = 'refund'),
    ADD CONSTRAINT payment_attempts_failed_after_success_only_on_refunds
        CHECK (failed_after_success_at IS NULL OR (kind = 'refund' AND status = 'failed'));

ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_operation_unique;
ALTER TABLE payment_attempts
    ADD CONSTRAINT payment_attempts_operation_unique UNIQUE (consumer, operation_key, generation);

-- A charge's refunds: summed by every refund insert (the over-refund guard) and shown on the
-- charge.
CREATE INDEX payment_attempts_parent
    ON payment_attempts (parent_attempt_id)
    WHERE parent_attempt_id IS NOT NULL;
