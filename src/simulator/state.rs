//! Every object the simulator holds and the operations on them. Callers hold the state lock for
//! one synchronous call at a time; nothing here awaits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::api::{
    ConfirmPaymentIntent, CreatePaymentIntent, CreateRefund, ListQuery, Operation, SearchQuery,
};
use super::control::{
    AuthenticationOutcome, CloseDispute, FailRefund, ForcePaymentIntent, Ledger, LedgerDispute,
    LedgerPaymentIntent, LedgerRefund, OpenDispute, RefundMode, RequestLogEntry,
    SeedPaymentIntent,
};
use super::faults::FaultTable;
use super::idempotency::IdempotencyStore;
use super::model::{
    CardBehaviour, DISPUTE_REASONS, Dispute, DisputeStatus, Origin, PaymentIntent,
    PaymentIntentStatus, REFUND_FAIL_PAYMENT_METHOD, REFUND_FAILURE_REASON_DEFAULT, Refund,
    RefundStatus, Settlement, test_payment_method,
};
use super::webhooks::Webhooks;
use super::wire::{ApiError, StoredResponse};
use super::{PAGE_SIZE_MAX, SimulatorConfig};

/// Characters of the random part of object ids (Stripe's are 24 base62 characters).
const ID_RANDOM_CHARS: usize = 24;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A decline's (code, decline code, message).
type Decline = (&'static str, &'static str, &'static str);
/// What a confirmation did: the event to emit and, for a decline, its error.
type Confirmed = (Option<&'static str>, Option<Decline>);

/// What an operation knows about the request that caused it.
#[derive(Debug, Clone)]
pub struct ExecContext {
    pub now: i64,
    pub request_id: String,
    pub idempotency_key: Option<String>,
    /// `http://host:port/`, for URLs the simulator hands out.
    pub base_url: String,
}

#[derive(Debug)]
pub struct State {
    config: SimulatorConfig,
    /// Each version of an intent is one allocation, shared with its search snapshot: an intent
    /// changes only by replacing it whole (`store_intent`), never in place.
    payment_intents: HashMap<String, Arc<PaymentIntent>>,
    refunds: HashMap<String, Refund>,
    disputes: HashMap<String, Dispute>,
    /// The status new refunds start in.
    refund_mode: RefundMode,
    /// (fails at, seq) → refund id, for refunds of `pm_card_refundFail`.
    refund_failures: BTreeMap<(i64, u64), String>,
    /// Charge id → payment intent id.
    charges: HashMap<String, String>,
    next_seq: u64,
    id_rng: ChaCha8Rng,
    pub fault_rng: ChaCha8Rng,
    pub faults: FaultTable,
    pub idempotency: IdempotencyStore,
    request_log: VecDeque<RequestLogEntry>,
    next_request_seq: u64,
    /// What search sees: the last snapshot whose lag has passed.
    search_index: HashMap<String, Arc<PaymentIntent>>,
    /// Snapshots waiting for the search lag, in the order they were taken.
    index_queue: VecDeque<(i64, Arc<PaymentIntent>)>,
    /// (settles at, seq) → payment intent id, for `processing` intents.
    settlements: BTreeMap<(i64, u64), String>,
    webhooks: Arc<Webhooks>,
}

impl State {
    pub fn new(config: SimulatorConfig, webhooks: Arc<Webhooks>) -> Self {
        let limits = &config.limits;
        Self {
            payment_intents: HashMap::new(),
            refunds: HashMap::new(),
            disputes: HashMap::new(),
            refund_mode: RefundMode::Succeeded,
            refund_failures: BTreeMap::new(),
            charges: HashMap::new(),
            next_seq: 0,
            id_rng: ChaCha8Rng::seed_from_u64(config.seed),
            fault_rng: ChaCha8Rng::seed_from_u64(config.seed.wrapping_add(1)),
            faults: FaultTable::new(limits.faults_max, limits.fault_latency_ms_max),
            idempotency: IdempotencyStore::new(
                config.idempotency_key_ttl_seconds,
                limits.idempotency_keys_max,
            ),
            request_log: VecDeque::new(),
            next_request_seq: 0,
            search_index: HashMap::new(),
            index_queue: VecDeque::new(),
            settlements: BTreeMap::new(),
            webhooks,
            config,
        }
    }

    pub fn new_id(&mut self, prefix: &str) -> String {
        let mut id = String::with_capacity(prefix.len() + 1 + ID_RANDOM_CHARS);
        id.push_str(prefix);
        id.push('_');
        for _ in 0..ID_RANDOM_CHARS {
            id.push(char::from(BASE62[self.id_rng.gen_range(0..BASE62.len())]));
        }
        id
    }

    fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn objects_len(&self) -> usize {
        self.payment_intents.len() + self.refunds.len() + self.disputes.len()
    }

    fn ensure_room(&self) -> Result<(), ApiError> {
        if self.objects_len() >= self.config.limits.objects_max {
            return Err(ApiError::new(
                429,
                super::wire::ErrorType::InvalidRequest,
                "The simulator holds its maximum number of objects (objects_max).",
            )
            .with_code("rate_limit"));
        }
        Ok(())
    }

    /// Brings time-driven state up to `now`: settlements, search index, key pruning.
    pub fn catch_up(&mut self, now: i64) {
        while let Some((&(at, seq), _)) = self.settlements.first_key_value() {
            if at > now {
                break;
            }
            let Some(id) = self.settlements.remove(&(at, seq)) else {
                break;
            };
            self.settle(&id, now);
        }
        while let Some((&(at, seq), _)) = self.refund_failures.first_key_value() {
            if at > now {
                break;
            }
            let Some(id) = self.refund_failures.remove(&(at, seq)) else {
                break;
            };
            // Already failed by the control: nothing left to do.
            let _ = self.fail_refund(&id, FailRefund::default(), now);
        }
        while self
            .index_queue
            .front()
            .is_some_and(|(visible_at, _)| *visible_at <= now)
        {
            if let Some((_, snapshot)) = self.index_queue.pop_front() {
                self.search_index.insert(snapshot.id.clone(), snapshot);
            }
        }
        self.idempotency.prune(now);
    }

    fn settle(&mut self, id: &str, now: i64) {
        let Some(mut intent) = self.payment_intent_copy(id) else {
            return;
        };
        let Some((_, settlement)) = intent.settlement.take() else {
            return;
        };
        if intent.status != PaymentIntentStatus::Processing {
            return;
        }
        let event = match settlement {
            Settlement::Succeeds => {
                intent.set_succeeded();
                "payment_intent.succeeded"
            }
            Settlement::Fails => {
                intent.set_declined(
                    "card_declined",
                    "generic_decline",
                    "The payment could not be completed.",
                );
                "payment_intent.payment_failed"
            }
        };
        self.store_intent(intent, now, Some(event), None);
    }

    /// Saves an intent, schedules its search snapshot and emits `event` (if any).
    fn store_intent(
        &mut self,
        intent: PaymentIntent,
        now: i64,
        event: Option<&str>,
        ctx: Option<&ExecContext>,
    ) {
        let lag = i64::try_from(self.config.search_lag_seconds).unwrap_or(i64::MAX);
        if self.index_queue.len() >= self.config.limits.objects_max {
            // Bounded: the oldest pending snapshot becomes visible early.
            if let Some((_, snapshot)) = self.index_queue.pop_front() {
                self.search_index.insert(snapshot.id.clone(), snapshot);
            }
        }
        let intent = Arc::new(intent);
        self.index_queue
            .push_back((now.saturating_add(lag), Arc::clone(&intent)));
        if let Some(event) = event {
            self.webhooks
                .emit(event, intent.id.clone(), || intent.render(), now, ctx);
        }
        self.payment_intents.insert(intent.id.clone(), intent);
    }

    /// A copy of an intent to change and store again.
    fn payment_intent_copy(&self, id: &str) -> Option<PaymentIntent> {
        self.payment_intents.get(id).map(|intent| PaymentIntent::clone(intent))
    }

    pub fn execute(&mut self, operation: Operation, ctx: &ExecContext) -> StoredResponse {
        self.catch_up(ctx.now);
        let result = match operation {
            Operation::CreatePaymentIntent(create) => self.create_payment_intent(create, ctx),
            Operation::RetrievePaymentIntent(id) => {
                self.intent(&id, true).map(PaymentIntent::render)
            }
            Operation::CancelPaymentIntent { id, reason } => {
                self.cancel_payment_intent(&id, reason, ctx)
            }
            Operation::ConfirmPaymentIntent(confirm) => self.confirm_payment_intent(confirm, ctx),
            Operation::ListPaymentIntents(query) => self.list_payment_intents(&query),
            Operation::SearchPaymentIntents(query) => self.search_payment_intents(&query),
            Operation::CreateRefund(create) => self.create_refund(create, ctx),
            Operation::RetrieveRefund(id) => self
                .refunds
                .get(&id)
                .map(Refund::render)
                .ok_or_else(|| ApiError::not_found("refund", &id, "id")),
            Operation::ListRefunds(query) => self.list_refunds(&query),
        };
        match result {
            Ok(body) => StoredResponse::ok(&body),
            Err(error) => error.into_stored(),
        }
    }

    fn intent(&self, id: &str, in_path: bool) -> Result<&PaymentIntent, ApiError> {
        self.payment_intents.get(id).map(Arc::as_ref).ok_or_else(|| {
            if in_path {
                ApiError::not_found("payment_intent", id, "intent")
            } else {
                ApiError::no_such("payment_intent", id, "payment_intent")
            }
        })
    }

    /// A fresh `requires_payment_method` intent with a new id, client secret and seq.
    fn new_intent(
        &mut self,
        amount: i64,
        currency: String,
        metadata: BTreeMap<String, String>,
        created: i64,
        origin: Origin,
    ) -> PaymentIntent {
        let id = self.new_id("pi");
        let secret = self.new_id("secret");
        PaymentIntent {
            seq: self.next_seq(),
            client_secret: format!("{id}_{secret}"),
            id,
            amount,
            amount_received: 0,
            amount_refunded: 0,
            currency,
            status: PaymentIntentStatus::RequiresPaymentMethod,
            metadata,
            created,
            description: None,
            customer: None,
            payment_method: None,
            capture_method: "automatic_async".into(),
            return_url: None,
            next_action: None,
            last_payment_error: None,
            latest_charge: None,
            canceled_at: None,
            cancellation_reason: None,
            idempotency_key: None,
            origin,
            settlement: None,
            confirmations: VecDeque::new(),
            confirmations_total: 0,
            disputed: false,
        }
    }

    fn create_payment_intent(
        &mut self,
        create: CreatePaymentIntent,
        ctx: &ExecContext,
    ) -> Result<Value, ApiError> {
        self.ensure_room()?;
        let behaviour = match &create.payment_method {
            Some(name) => Some(
                test_payment_method(name)
                    .ok_or_else(|| ApiError::no_such("PaymentMethod", name, "payment_method"))?,
            ),
            None => None,
        };
        let mut intent = self.new_intent(
            create.amount,
            create.currency,
            create.metadata,
            ctx.now,
            Origin::Api,
        );
        intent.idempotency_key.clone_from(&ctx.idempotency_key);
        intent.description = create.description;
        intent.customer = create.customer;
        intent.payment_method = create.payment_method;
        intent.capture_method = create.capture_method;
        intent.return_url = create.return_url;
        let (event, decline) = match (behaviour, create.confirm) {
            (None, _) => (None, None),
            (Some(_), false) => {
                intent.status = PaymentIntentStatus::RequiresConfirmation;
                (None, None)
            }
            (Some(behaviour), true) => self.confirm(&mut intent, behaviour, ctx),
        };
        self.store_answered(intent, event, decline, ctx)
    }

    /// Stores an intent a request changed, emits its event and answers: the intent, or the
    /// 402 card error of a decline (whose body carries the intent as it now is).
    fn store_answered(
        &mut self,
        intent: PaymentIntent,
        event: Option<&'static str>,
        decline: Option<Decline>,
        ctx: &ExecContext,
    ) -> Result<Value, ApiError> {
        let body = intent.render();
        let error = decline
            .map(|(code, decline_code, message)| intent.decline_error(code, decline_code, message));
        self.store_intent(intent, ctx.now, event, Some(ctx));
        match error {
            Some(error) => Err(error),
            None => Ok(body),
        }
    }

    /// Stripe's confirm: only an intent without a payment in flight or done may be confirmed
    /// (`requires_payment_method` after a decline, or `requires_confirmation`); a new payment
    /// method replaces the intent's. A PaymentIntent succeeds at most once.
    fn confirm_payment_intent(
        &mut self,
        confirm: ConfirmPaymentIntent,
        ctx: &ExecContext,
    ) -> Result<Value, ApiError> {
        let mut intent = self.intent(&confirm.id, true)?.clone();
        if !matches!(
            intent.status,
            PaymentIntentStatus::RequiresPaymentMethod | PaymentIntentStatus::RequiresConfirmation
        ) {
            let mut error = ApiError::invalid_request(
                None,
                format!(
                    "You cannot confirm this PaymentIntent because it has a status of {}. Only a \
                     PaymentIntent with one of the following statuses may be confirmed: \
                     requires_payment_method, requires_confirmation.",
                    intent.status.as_str()
                ),
            )
            .with_code("payment_intent_unexpected_state");
            error.payment_intent = Some(Box::new(intent.render()));
            return Err(error);
        }
        let payment_method = confirm
            .payment_method
            .or_else(|| intent.payment_method.clone())
            .ok_or_else(|| {
                ApiError::invalid_request(
                    Some("payment_method"),
                    "You cannot confirm this PaymentIntent because it's missing a payment method. \
                     Pass payment_method to confirm it.",
                )
                .with_code("parameter_missing")
            })?;
        let behaviour = test_payment_method(&payment_method).ok_or_else(|| {
            ApiError::no_such("PaymentMethod", &payment_method, "payment_method")
        })?;
        intent.payment_method = Some(payment_method);
        if confirm.return_url.is_some() {
            intent.return_url = confirm.return_url;
        }
        // Stripe clears the previous confirmation's error when the intent is confirmed again.
        intent.last_payment_error = None;
        let (event, decline) = self.confirm(&mut intent, behaviour, ctx);
        self.store_answered(intent, event, decline, ctx)
    }

    /// Confirms with a payment method (its behaviour) and records the confirmation.
    fn confirm(
        &mut self,
        intent: &mut PaymentIntent,
        behaviour: CardBehaviour,
        ctx: &ExecContext,
    ) -> Confirmed {
        let outcome = self.apply_behaviour(intent, behaviour, ctx);
        intent.record_confirmation(ctx.idempotency_key.clone(), ctx.now);
        outcome
    }

    /// Applies a payment method's behaviour; returns the event and, for a decline, the error.
    fn apply_behaviour(
        &mut self,
        intent: &mut PaymentIntent,
        behaviour: CardBehaviour,
        ctx: &ExecContext,
    ) -> Confirmed {
        match behaviour {
            CardBehaviour::Succeeds => {
                self.attach_charge(intent);
                intent.set_succeeded();
                (Some("payment_intent.succeeded"), None)
            }
            CardBehaviour::Declines {
                code,
                decline_code,
                message,
            } => {
                self.attach_charge(intent);
                intent.set_declined(code, decline_code, message);
                (
                    Some("payment_intent.payment_failed"),
                    Some((code, decline_code, message)),
                )
            }
            CardBehaviour::RequiresAction => {
                intent.status = PaymentIntentStatus::RequiresAction;
                intent.next_action = Some(json!({
                    "type": "redirect_to_url",
                    "redirect_to_url": {
                        "url": format!("{}_sim/3ds/{}", ctx.base_url, intent.id),
                        "return_url": intent.return_url,
                    },
                }));
                (Some("payment_intent.requires_action"), None)
            }
            CardBehaviour::Processing { settles } => {
                self.attach_charge(intent);
                intent.status = PaymentIntentStatus::Processing;
                let delay = i64::try_from(self.config.settlement_delay_seconds).unwrap_or(i64::MAX);
                let at = ctx.now.saturating_add(delay);
                intent.settlement = Some((at, settles));
                self.settlements.insert((at, intent.seq), intent.id.clone());
                (Some("payment_intent.processing"), None)
            }
        }
    }

    fn attach_charge(&mut self, intent: &mut PaymentIntent) {
        let charge = self.new_id("ch");
        self.charges.insert(charge.clone(), intent.id.clone());
        intent.latest_charge = Some(charge);
    }

    fn cancel_payment_intent(
        &mut self,
        id: &str,
        reason: Option<String>,
        ctx: &ExecContext,
    ) -> Result<Value, ApiError> {
        let mut intent = self.intent(id, true)?.clone();
        if matches!(
            intent.status,
            PaymentIntentStatus::Succeeded | PaymentIntentStatus::Canceled
        ) {
            return Err(ApiError::invalid_request(
                None,
                format!(
                    "You cannot cancel this PaymentIntent because it has a status of {}.",
                    intent.status.as_str()
                ),
            )
            .with_code("payment_intent_unexpected_state"));
        }
        intent.status = PaymentIntentStatus::Canceled;
        intent.canceled_at = Some(ctx.now);
        intent.cancellation_reason = reason;
        intent.next_action = None;
        if let Some((at, _)) = intent.settlement.take() {
            self.settlements.remove(&(at, intent.seq));
        }
        let body = intent.render();
        self.store_intent(intent, ctx.now, Some("payment_intent.canceled"), Some(ctx));
        Ok(body)
    }

    fn list_payment_intents(&self, query: &ListQuery) -> Result<Value, ApiError> {
        let mut items: Vec<&PaymentIntent> = self
            .payment_intents
            .values()
            .map(Arc::as_ref)
            .filter(|intent| query.created.contains(intent.created))
            .collect();
        items.sort_by_key(|intent| std::cmp::Reverse((intent.created, intent.seq)));
        let keys: Vec<(i64, u64, &PaymentIntent)> = items
            .into_iter()
            .map(|intent| (intent.created, intent.seq, intent))
            .collect();
        let cursor = |id: &str| {
            self.payment_intents
                .get(id)
                .map(|intent| (intent.created, intent.seq))
        };
        page(keys, query, cursor, PaymentIntent::render, "payment_intent", "/v1/payment_intents")
    }

    fn list_refunds(&self, query: &ListQuery) -> Result<Value, ApiError> {
        let mut items: Vec<&Refund> = self
            .refunds
            .values()
            .filter(|refund| query.created.contains(refund.created))
            .filter(|refund| {
                query
                    .payment_intent
                    .as_ref()
                    .is_none_or(|id| &refund.payment_intent == id)
            })
            .collect();
        items.sort_by_key(|refund| std::cmp::Reverse((refund.created, refund.seq)));
        let keys: Vec<(i64, u64, &Refund)> = items
            .into_iter()
            .map(|refund| (refund.created, refund.seq, refund))
            .collect();
        let cursor = |id: &str| {
            self.refunds
                .get(id)
                .map(|refund| (refund.created, refund.seq))
        };
        page(keys, query, cursor, Refund::render, "refund", "/v1/refunds")
    }

    fn search_payment_intents(&self, query: &SearchQuery) -> Result<Value, ApiError> {
        let mut hits: Vec<&PaymentIntent> = self
            .search_index
            .values()
            .map(Arc::as_ref)
            .filter(|snapshot| query.query.matches(snapshot))
            .collect();
        hits.sort_by_key(|snapshot| std::cmp::Reverse((snapshot.created, snapshot.seq)));
        // The page token is the seq of the last object returned ("page_<seq>").
        let start = match &query.page {
            None => 0,
            Some(token) => {
                let seq = token
                    .strip_prefix("page_")
                    .and_then(|seq| seq.parse::<u64>().ok())
                    .ok_or_else(|| {
                        ApiError::invalid_request(Some("page"), "Invalid page token.")
                    })?;
                hits.iter()
                    .position(|snapshot| snapshot.seq == seq)
                    .map_or(hits.len(), |index| index + 1)
            }
        };
        let page: Vec<&PaymentIntent> =
            hits.iter().skip(start).take(query.limit).copied().collect();
        let has_more = start + page.len() < hits.len();
        let data: Vec<Value> = page
            .iter()
            .map(|snapshot| {
                self.payment_intents
                    .get(&snapshot.id)
                    .map_or(*snapshot, Arc::as_ref)
                    .render()
            })
            .collect();
        let next_page = match page.last() {
            Some(last) if has_more => Some(format!("page_{}", last.seq)),
            _ => None,
        };
        Ok(json!({
            "object": "search_result",
            "url": "/v1/payment_intents/search",
            "has_more": has_more,
            "data": data,
            "next_page": next_page,
        }))
    }

    fn create_refund(
        &mut self,
        create: CreateRefund,
        ctx: &ExecContext,
    ) -> Result<Value, ApiError> {
        self.ensure_room()?;
        let intent_id = match (&create.payment_intent, &create.charge) {
            (Some(id), _) => self.intent(id, false)?.id.clone(),
            (None, Some(charge)) => self
                .charges
                .get(charge)
                .cloned()
                .ok_or_else(|| ApiError::no_such("charge", charge, "charge"))?,
            (None, None) => return Err(ApiError::missing("payment_intent")),
        };
        let mut intent = self.intent(&intent_id, false)?.clone();
        if intent.status != PaymentIntentStatus::Succeeded {
            return Err(ApiError::invalid_request(
                Some("payment_intent"),
                format!(
                    "This PaymentIntent ({}) does not have a successful charge to refund.",
                    intent.id
                ),
            ));
        }
        let charge = intent.latest_charge.clone().unwrap_or_default();
        if self.disputes.values().any(|dispute| {
            dispute.payment_intent == intent.id && dispute.status != DisputeStatus::Won
        }) {
            return Err(ApiError::invalid_request(
                None,
                format!("Charge {charge} has been charged back; cannot issue a refund."),
            )
            .with_code("charge_disputed"));
        }
        // Pending refunds count too (`amount_refunded` holds pending and succeeded ones).
        let refundable = intent.refundable();
        if refundable <= 0 {
            return Err(ApiError::invalid_request(
                None,
                format!("Charge {charge} has already been refunded."),
            )
            .with_code("charge_already_refunded"));
        }
        let amount = create.amount.unwrap_or(refundable);
        if amount > refundable {
            return Err(ApiError::invalid_request(
                Some("amount"),
                format!(
                    // Stripe's wording, without a final period.
                    "Refund amount ({}) is greater than unrefunded amount on charge ({})",
                    money(&intent.currency, amount),
                    money(&intent.currency, refundable)
                ),
            )
            .with_code("amount_too_large"));
        }
        let seq = self.next_seq();
        let status = match self.refund_mode {
            RefundMode::Succeeded => RefundStatus::Succeeded,
            RefundMode::Pending => RefundStatus::Pending,
        };
        let fails_at = (intent.payment_method.as_deref() == Some(REFUND_FAIL_PAYMENT_METHOD))
            .then(|| {
                ctx.now
                    .saturating_add(i64::try_from(self.config.settlement_delay_seconds).unwrap_or(i64::MAX))
            });
        let refund = Refund {
            seq,
            id: self.new_id("re"),
            amount,
            currency: intent.currency.clone(),
            charge: intent.latest_charge.clone(),
            payment_intent: intent.id.clone(),
            metadata: create.metadata,
            reason: create.reason,
            status,
            failure_reason: None,
            created: ctx.now,
            idempotency_key: ctx.idempotency_key.clone(),
            fails_at,
        };
        if let Some(at) = fails_at {
            self.refund_failures.insert((at, seq), refund.id.clone());
        }
        intent.amount_refunded += amount;
        let body = refund.render();
        self.webhooks
            .emit_rendered("refund.created", body.clone(), ctx.now, Some(ctx));
        if status == RefundStatus::Succeeded
            && let Some(charge) = intent.render_charge()
        {
            self.webhooks
                .emit_rendered("charge.refunded", charge, ctx.now, Some(ctx));
        }
        self.refunds.insert(refund.id.clone(), refund);
        self.payment_intents.insert(intent.id.clone(), Arc::new(intent));
        Ok(body)
    }

    /// Sets the status new refunds start in.
    pub fn set_refund_mode(&mut self, mode: RefundMode) {
        self.refund_mode = mode;
    }

    /// A copy of a refund for a control call to change and store back.
    fn refund_copy(&self, id: &str) -> Result<Refund, String> {
        self.refunds
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no refund {id}"))
    }

    /// A pending refund succeeds: `refund.updated`, then `charge.refunded`.
    pub fn settle_refund(&mut self, id: &str, now: i64) -> Result<Value, String> {
        let mut refund = self.refund_copy(id)?;
        if refund.status != RefundStatus::Pending {
            return Err(format!(
                "refund {id} is {}, not pending",
                refund.status.as_str()
            ));
        }
        refund.status = RefundStatus::Succeeded;
        let body = refund.render();
        self.webhooks.emit_rendered("refund.updated", body.clone(), now, None);
        if let Some(charge) = self
            .payment_intents
            .get(&refund.payment_intent)
            .and_then(|intent| intent.render_charge())
        {
            self.webhooks.emit_rendered("charge.refunded", charge, now, None);
        }
        self.refunds.insert(refund.id.clone(), refund);
        Ok(body)
    }

    /// A pending or succeeded refund fails (Stripe's refunds that fail after succeeding): the
    /// amount goes back to the charge's refundable amount; `refund.updated`, `refund.failed`
    /// and `charge.refund.updated` follow.
    pub fn fail_refund(&mut self, id: &str, fail: FailRefund, now: i64) -> Result<Value, String> {
        let mut refund = self.refund_copy(id)?;
        if !refund.status.holds_amount() {
            return Err(format!("refund {id} is already {}", refund.status.as_str()));
        }
        let mut intent = self
            .payment_intent_copy(&refund.payment_intent)
            .ok_or_else(|| format!("refund {id} has no payment intent"))?;
        debug_assert!(intent.amount_refunded >= refund.amount);
        intent.amount_refunded -= refund.amount;
        refund.status = RefundStatus::Failed;
        refund.failure_reason = Some(
            fail.failure_reason
                .unwrap_or_else(|| REFUND_FAILURE_REASON_DEFAULT.to_owned()),
        );
        if let Some(at) = refund.fails_at.take() {
            self.refund_failures.remove(&(at, refund.seq));
        }
        let body = refund.render();
        self.webhooks.emit_rendered("refund.updated", body.clone(), now, None);
        self.webhooks.emit_rendered("refund.failed", body.clone(), now, None);
        self.webhooks
            .emit_rendered("charge.refund.updated", body.clone(), now, None);
        self.refunds.insert(refund.id.clone(), refund);
        self.payment_intents.insert(intent.id.clone(), Arc::new(intent));
        Ok(body)
    }

    /// Opens a dispute on a succeeded intent's charge: `charge.dispute.created`.
    pub fn open_dispute(
        &mut self,
        payment_intent: &str,
        open: OpenDispute,
        now: i64,
    ) -> Result<Value, String> {
        self.ensure_room().map_err(|error| error.message)?;
        let mut intent = self
            .payment_intent_copy(payment_intent)
            .ok_or_else(|| format!("no payment intent {payment_intent}"))?;
        let charge = match (&intent.status, &intent.latest_charge) {
            (PaymentIntentStatus::Succeeded, Some(charge)) => charge.clone(),
            _ => {
                return Err(format!(
                    "payment intent {payment_intent} is {}: no successful charge to dispute",
                    intent.status.as_str()
                ));
            }
        };
        let amount = open.amount.unwrap_or(intent.amount_received);
        if !(1..=intent.amount_received).contains(&amount) {
            return Err(format!(
                "amount must be 1 to {} (the charge's amount)",
                intent.amount_received
            ));
        }
        let reason = open.reason.unwrap_or_else(|| "general".to_owned());
        if !DISPUTE_REASONS.contains(&reason.as_str()) {
            return Err(format!("unknown dispute reason {reason:?}"));
        }
        let dispute = Dispute {
            seq: self.next_seq(),
            id: self.new_id("dp"),
            amount,
            currency: intent.currency.clone(),
            charge,
            payment_intent: intent.id.clone(),
            reason,
            status: DisputeStatus::NeedsResponse,
            created: now,
        };
        intent.disputed = true;
        let body = dispute.render();
        self.webhooks
            .emit_rendered("charge.dispute.created", body.clone(), now, None);
        self.disputes.insert(dispute.id.clone(), dispute);
        self.payment_intents.insert(intent.id.clone(), Arc::new(intent));
        Ok(body)
    }

    /// Closes an open dispute as won or lost: `charge.dispute.closed`.
    pub fn close_dispute(&mut self, id: &str, close: CloseDispute, now: i64) -> Result<Value, String> {
        let mut dispute = self
            .disputes
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no dispute {id}"))?;
        if dispute.status != DisputeStatus::NeedsResponse {
            return Err(format!("dispute {id} is already {}", dispute.status.as_str()));
        }
        if close.status == DisputeStatus::NeedsResponse {
            return Err("status must be won or lost".to_owned());
        }
        dispute.status = close.status;
        let body = dispute.render();
        self.webhooks
            .emit_rendered("charge.dispute.closed", body.clone(), now, None);
        self.disputes.insert(dispute.id.clone(), dispute);
        Ok(body)
    }

    pub fn log_request(&mut self, mut entry: RequestLogEntry) {
        self.next_request_seq += 1;
        entry.seq = self.next_request_seq;
        if self.request_log.len() >= self.config.limits.request_log_entries_max {
            self.request_log.pop_front();
        }
        self.request_log.push_back(entry);
    }

    pub fn requests(&self) -> Vec<RequestLogEntry> {
        self.request_log.iter().cloned().collect()
    }

    pub fn ledger(&self) -> Ledger {
        let mut payment_intents: Vec<&PaymentIntent> = self.payment_intents.values().map(Arc::as_ref).collect();
        payment_intents.sort_by_key(|intent| intent.seq);
        let mut refunds: Vec<&Refund> = self.refunds.values().collect();
        refunds.sort_by_key(|refund| refund.seq);
        let mut disputes: Vec<&Dispute> = self.disputes.values().collect();
        disputes.sort_by_key(|dispute| dispute.seq);
        Ledger {
            payment_intents: payment_intents.into_iter().map(LedgerPaymentIntent::of).collect(),
            refunds: refunds
                .into_iter()
                .map(|refund| LedgerRefund {
                    id: refund.id.clone(),
                    payment_intent: refund.payment_intent.clone(),
                    idempotency_key: refund.idempotency_key.clone(),
                    metadata: refund.metadata.clone(),
                    amount: refund.amount,
                    currency: refund.currency.clone(),
                    status: refund.status.as_str().to_owned(),
                    failure_reason: refund.failure_reason.clone(),
                    reason: refund.reason.clone(),
                    created: refund.created,
                })
                .collect(),
            disputes: disputes
                .into_iter()
                .map(|dispute| LedgerDispute {
                    id: dispute.id.clone(),
                    payment_intent: dispute.payment_intent.clone(),
                    charge: dispute.charge.clone(),
                    amount: dispute.amount,
                    currency: dispute.currency.clone(),
                    status: dispute.status.as_str().to_owned(),
                    reason: dispute.reason.clone(),
                    created: dispute.created,
                })
                .collect(),
        }
    }

    /// Creates an intent outside the idempotency layer (to seed discrepancies for reports).
    pub fn seed_payment_intent(
        &mut self,
        seed: SeedPaymentIntent,
        now: i64,
    ) -> Result<LedgerPaymentIntent, String> {
        self.ensure_room().map_err(|error| error.message)?;
        let status = PaymentIntentStatus::parse(&seed.status)
            .ok_or_else(|| format!("unknown status {:?}", seed.status))?;
        if seed.amount < 1 {
            return Err("amount must be positive".into());
        }
        let created = seed.created.unwrap_or(now);
        let mut intent = self.new_intent(
            seed.amount,
            seed.currency.to_ascii_lowercase(),
            seed.metadata,
            created,
            Origin::Control,
        );
        intent.status = status;
        intent.payment_method = Some("pm_card_visa".into());
        if status == PaymentIntentStatus::Succeeded {
            self.attach_charge(&mut intent);
            intent.set_succeeded();
        }
        self.store_intent(intent.clone(), now, None, None);
        Ok(self
            .ledger_entry(&intent.id)
            .ok_or("seeded intent vanished")?)
    }

    /// One intent's ledger entry, without rendering the whole ledger (seeding stays linear).
    fn ledger_entry(&self, id: &str) -> Option<LedgerPaymentIntent> {
        self.payment_intents.get(id).map(|intent| LedgerPaymentIntent::of(intent))
    }

    /// Changes an intent behind the API's back (no event), to seed discrepancies.
    pub fn force_payment_intent(
        &mut self,
        id: &str,
        force: ForcePaymentIntent,
        now: i64,
    ) -> Result<(), String> {
        let mut intent = self
            .payment_intent_copy(id)
            .ok_or_else(|| format!("no payment intent {id}"))?;
        if let Some(amount) = force.amount {
            intent.amount = amount;
            if intent.status == PaymentIntentStatus::Succeeded {
                intent.amount_received = amount;
            }
        }
        if let Some(status) = force.status {
            let status = PaymentIntentStatus::parse(&status)
                .ok_or_else(|| format!("unknown status {status:?}"))?;
            if status == PaymentIntentStatus::Succeeded && intent.latest_charge.is_none() {
                self.attach_charge(&mut intent);
            }
            intent.status = status;
            intent.amount_received = if status == PaymentIntentStatus::Succeeded {
                intent.amount
            } else {
                0
            };
        }
        self.store_intent(intent, now, None, None);
        Ok(())
    }

    /// Completes or fails the customer action of a `requires_action` intent.
    pub fn authenticate(
        &mut self,
        id: &str,
        outcome: AuthenticationOutcome,
        now: i64,
    ) -> Result<Value, String> {
        let mut intent = self
            .payment_intent_copy(id)
            .ok_or_else(|| format!("no payment intent {id}"))?;
        if intent.status != PaymentIntentStatus::RequiresAction {
            return Err(format!(
                "payment intent {id} is {}, not requires_action",
                intent.status.as_str()
            ));
        }
        self.attach_charge(&mut intent);
        let event = match outcome {
            AuthenticationOutcome::Succeed => {
                intent.set_succeeded();
                "payment_intent.succeeded"
            }
            AuthenticationOutcome::Fail => {
                intent.next_action = None;
                intent.set_declined(
                    "payment_intent_authentication_failure",
                    "authentication_required",
                    "The provided PaymentMethod has failed authentication.",
                );
                "payment_intent.payment_failed"
            }
        };
        let body = intent.render();
        self.store_intent(intent, now, Some(event), None);
        Ok(body)
    }

    /// Amount and currency of an intent waiting for 3-D Secure; `None` for any other.
    pub fn awaiting_authentication(&self, id: &str) -> Option<(i64, String)> {
        self.payment_intents
            .get(id)
            .filter(|intent| intent.status == PaymentIntentStatus::RequiresAction)
            .map(|intent| (intent.amount, intent.currency.clone()))
    }

    pub fn return_url(&self, id: &str) -> Option<String> {
        self.payment_intents
            .get(id)
            .and_then(|intent| intent.return_url.clone())
    }
}

/// An amount as Stripe's refund errors write it: a symbol for usd, gbp and eur (`$7.01`,
/// `£7.01`), `7.01 CHF` for the others.
fn money(currency: &str, amount_minor: i64) -> String {
    let Ok(parsed) = crate::domain::Currency::parse(currency) else {
        return amount_minor.to_string();
    };
    let major = parsed.format_major(amount_minor);
    match currency {
        "usd" => format!("${major}"),
        "gbp" => format!("£{major}"),
        "eur" => format!("€{major}"),
        _ => format!("{major} {}", currency.to_ascii_uppercase()),
    }
}

/// One page of a list: `keys` sorted newest first; `cursor` finds an id's sort key. Only the
/// page's objects are rendered, so a page costs the same however many objects the range holds.
fn page<T>(
    keys: Vec<(i64, u64, &T)>,
    query: &ListQuery,
    cursor: impl Fn(&str) -> Option<(i64, u64)>,
    render: impl Fn(&T) -> Value,
    object: &str,
    url: &str,
) -> Result<Value, ApiError> {
    debug_assert!(query.limit <= PAGE_SIZE_MAX);
    let (data, has_more): (Vec<Value>, bool) = match (&query.starting_after, &query.ending_before) {
        (Some(after), _) => {
            let bound =
                cursor(after).ok_or_else(|| ApiError::no_such(object, after, "starting_after"))?;
            let mut rest = keys
                .into_iter()
                .filter(|(created, seq, _)| (*created, *seq) < bound);
            let data: Vec<Value> = rest
                .by_ref()
                .take(query.limit)
                .map(|(_, _, item)| render(item))
                .collect();
            (data, rest.next().is_some())
        }
        (None, Some(before)) => {
            let bound =
                cursor(before).ok_or_else(|| ApiError::no_such(object, before, "ending_before"))?;
            let newer: Vec<&T> = keys
                .into_iter()
                .filter(|(created, seq, _)| (*created, *seq) > bound)
                .map(|(_, _, item)| item)
                .collect();
            let skip = newer.len().saturating_sub(query.limit);
            (newer.into_iter().skip(skip).map(&render).collect(), skip > 0)
        }
        (None, None) => {
            let has_more = keys.len() > query.limit;
            (
                keys.into_iter()
                    .take(query.limit)
                    .map(|(_, _, item)| render(item))
                    .collect(),
                has_more,
            )
        }
    };
    Ok(json!({ "object": "list", "url": url, "has_more": has_more, "data": data }))
}

impl LedgerPaymentIntent {
    fn of(intent: &PaymentIntent) -> Self {
        Self {
            id: intent.id.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            metadata: intent.metadata.clone(),
            amount: intent.amount,
            amount_received: intent.amount_received,
            amount_refunded: intent.amount_refunded,
            currency: intent.currency.clone(),
            status: intent.status.as_str().to_owned(),
            created: intent.created,
            origin: intent.origin,
            return_url: intent.return_url.clone(),
            confirmations: intent.confirmations.iter().cloned().collect(),
            confirmations_total: intent.confirmations_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulator::api::CreatedRange;

    /// Items 1..=5, newest first, each rendered as its own number; the cursor of "5" is 5.
    fn list(limit: usize, starting_after: Option<&str>, ending_before: Option<&str>) -> Value {
        let items: Vec<i64> = (1..=5).rev().collect();
        let keys: Vec<(i64, u64, &i64)> = items.iter().map(|item| (*item, 0, item)).collect();
        let query = ListQuery {
            created: CreatedRange::default(),
            limit,
            starting_after: starting_after.map(str::to_owned),
            ending_before: ending_before.map(str::to_owned),
            payment_intent: None,
        };
        let cursor = |id: &str| id.parse::<i64>().ok().map(|created| (created, 0));
        page(keys, &query, cursor, |item| json!(item), "thing", "/v1/things").unwrap()
    }

    #[test]
    fn refund_errors_write_amounts_in_major_units_as_stripe_does() {
        assert_eq!(money("usd", 2_500), "$25.00");
        assert_eq!(money("gbp", 9_390), "£93.90");
        assert_eq!(money("eur", 5), "€0.05");
        assert_eq!(money("jpy", 500), "500 JPY");
        assert_eq!(money("kwd", 1_234), "1.234 KWD");
    }

    #[test]
    fn a_page_holds_the_limit_from_either_cursor_and_says_whether_more_follow() {
        let shown = |value: Value| (value["data"].clone(), value["has_more"].as_bool().unwrap());
        assert_eq!(shown(list(2, None, None)), (json!([5, 4]), true));
        assert_eq!(shown(list(2, Some("4"), None)), (json!([3, 2]), true));
        assert_eq!(shown(list(2, Some("2"), None)), (json!([1]), false));
        assert_eq!(shown(list(2, None, Some("2"))), (json!([4, 3]), true));
        assert_eq!(shown(list(2, None, Some("4"))), (json!([5]), false));
    }

    /// An intent and its search snapshot are one allocation until the intent changes: the
    /// simulator keeps every object it made, and a copy each doubled what an intent cost.
    #[test]
    fn an_intent_and_its_search_snapshot_share_one_allocation_until_it_changes() {
        let config = SimulatorConfig::default();
        let webhooks = Arc::new(Webhooks::new(None, config.seed, config.limits.clone()).unwrap());
        let mut state = State::new(config, webhooks);
        let ctx = ExecContext {
            now: 1_700_000_000,
            request_id: "req_1".into(),
            idempotency_key: None,
            base_url: "http://127.0.0.1:1/".into(),
        };
        let create = CreatePaymentIntent {
            amount: 1_000,
            currency: "usd".into(),
            confirm: false,
            payment_method: Some("pm_card_visa".into()),
            metadata: BTreeMap::new(),
            description: None,
            customer: None,
            capture_method: "automatic".into(),
            return_url: None,
        };
        let created = state.execute(Operation::CreatePaymentIntent(create), &ctx);
        let body: Value = serde_json::from_slice(&created.body).unwrap();
        let id = body["id"].as_str().unwrap().to_owned();
        // Past the search lag, the snapshot is in the index.
        let later = ctx.now + i64::try_from(state.config.search_lag_seconds).unwrap() + 1;
        state.catch_up(later);
        assert!(Arc::ptr_eq(&state.payment_intents[&id], &state.search_index[&id]));

        let cancel = Operation::CancelPaymentIntent { id: id.clone(), reason: None };
        state.execute(cancel, &ExecContext { now: later, ..ctx });
        assert!(!Arc::ptr_eq(&state.payment_intents[&id], &state.search_index[&id]), "a change is a new version");
        assert_eq!(state.payment_intents[&id].status, PaymentIntentStatus::Canceled);
        assert_eq!(state.search_index[&id].status, PaymentIntentStatus::RequiresConfirmation, "search lags behind it");
    }
}
