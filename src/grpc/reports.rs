//! The `Reports` service: reconciliation reports streamed to finance and admin operators.
//! The report is prepared and read in a task that feeds a bounded channel, so a slow reader
//! holds back the reading of rows instead of growing memory, and a reader that goes away stops
//! the task and deletes the run's staging.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::{Authenticator, bearer_token};
use super::convert::{status_to_proto, time_to_proto};
use super::proto::reconciliation_chunk::Item;
use super::proto::reports_server::Reports;
use super::{proto, status};
use crate::config::{OperatorConfig, OperatorRole};
use crate::finance::{LOGIN_PATH, Logins, TICKET_TTL, Viewer};
use crate::report::{Category, PreparedReport, ReportPeriod, ReportRow, Reporter, Summary};

/// Chunks buffered between the report task and the client.
const CHUNKS_BUFFERED_MAX: usize = 64;

/// Operators by token hash (several per operator while rotating). Holds only hashes, like
/// [`Authenticator`], and compares every one in constant time.
#[derive(Clone, Default)]
pub struct Operators {
    by_token_hash: Vec<([u8; 32], (String, OperatorRole))>,
}

impl Operators {
    pub fn from_config(operators: &[OperatorConfig]) -> Self {
        let mut by_token_hash = Vec::new();
        for operator in operators {
            for hash in operator.token_sha256.iter() {
                let mut digest = [0u8; 32];
                // `Config::validate` refused anything but 64 hex digits; a hash that is not
                // one matches no token.
                if hex::decode_to_slice(hash, &mut digest).is_ok() {
                    by_token_hash.push((digest, (operator.name.clone(), operator.role)));
                }
            }
        }
        Self { by_token_hash }
    }

    /// The operator holding `token`, with their role.
    pub fn find(&self, token: &[u8]) -> Option<&(String, OperatorRole)> {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let digest: [u8; 32] = sha2::Sha256::digest(token).into();
        let mut found = None;
        for (entry, operator) in &self.by_token_hash {
            if bool::from(entry.ct_eq(&digest)) {
                found = Some(operator);
            }
        }
        found
    }
}

pub struct ReportsService {
    reporter: Reporter,
    operators: Operators,
    consumers: Authenticator,
    /// Where `CreateFinanceLogin` tickets go; `None` refuses the call.
    finance: Option<FinanceLinks>,
}

/// What a login link needs: the tickets the HTTP routes accept, and how to reach them.
pub struct FinanceLinks {
    pub logins: Logins,
    pub http_port: u16,
    pub http_tls: bool,
}

impl ReportsService {
    pub fn new(reporter: Reporter, operators: Operators, consumers: Authenticator) -> Self {
        Self {
            reporter,
            operators,
            consumers,
            finance: None,
        }
    }

    /// Lets `CreateFinanceLogin` issue tickets for the finance page.
    pub fn with_finance_links(mut self, links: FinanceLinks) -> Self {
        self.finance = Some(links);
        self
    }

    pub fn into_server(self) -> proto::reports_server::ReportsServer<Self> {
        proto::reports_server::ReportsServer::new(self)
    }

    /// Finance and admin operators only; the operator's name, for the log.
    fn authorize<T>(&self, request: &Request<T>) -> Result<String, Status> {
        let header = request.metadata().get("authorization").map(|value| value.as_bytes());
        let token = bearer_token(header.unwrap_or_default());
        if let Ok(token) = token
            && let Some((name, role)) = self.operators.find(token)
        {
            return match role {
                OperatorRole::Finance | OperatorRole::Admin => Ok(name.clone()),
            };
        }
        match self.consumers.authenticate(request) {
            Ok(consumer) => Err(status::permission_denied(format!(
                "consumer {consumer} may not read reports: they need an operator token with the finance or admin role"
            ))),
            Err(error) => Err(status::unauthenticated(error)),
        }
    }
}

#[tonic::async_trait]
impl Reports for ReportsService {
    type StreamReconciliationStream = ReceiverStream<Result<proto::ReconciliationChunk, Status>>;

    async fn stream_reconciliation(
        &self,
        request: Request<proto::ReconciliationRequest>,
    ) -> Result<Response<Self::StreamReconciliationStream>, Status> {
        let operator = self.authorize(&request)?;
        let reporter = self.reporter.clone();
        let period = period(request.get_ref(), reporter.settings().period_days_max)?;
        tracing::info!(%operator, from = %period.from(), to = %period.to(), "reconciliation report requested");
        let (sender, receiver) = mpsc::channel(CHUNKS_BUFFERED_MAX);
        tokio::spawn(stream_report(reporter, period, sender));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn create_finance_login(
        &self,
        request: Request<proto::FinanceLoginRequest>,
    ) -> Result<Response<proto::FinanceLoginResponse>, Status> {
        let operator = self.authorize(&request)?;
        let Some(finance) = &self.finance else {
            return Err(status::unimplemented("this server has no finance page"));
        };
        let ticket = finance.logins.issue_ticket(Viewer { operator: operator.clone() });
        // The ticket is a secret until used: it goes to the caller only, never to the log.
        tracing::info!(%operator, "finance login link issued");
        let query = serde_urlencoded::to_string([("ticket", ticket.expose())]).map_err(|error| {
            tracing::error!(%error, "encoding the finance login ticket");
            status::internal()
        })?;
        Ok(Response::new(proto::FinanceLoginResponse {
            path: format!("{LOGIN_PATH}?{query}"),
            http_port: u32::from(finance.http_port),
            http_tls: finance.http_tls,
            expires_in_seconds: u32::try_from(TICKET_TTL.as_secs()).unwrap_or(u32::MAX),
            operator,
        }))
    }
}

type ChunkSender = mpsc::Sender<Result<proto::ReconciliationChunk, Status>>;

fn period(request: &proto::ReconciliationRequest, days_max: u32) -> Result<ReportPeriod, Status> {
    let instant = |field: &'static str, value: Option<&prost_types::Timestamp>| {
        let value = value.ok_or_else(|| {
            status::invalid_field(crate::domain::InvalidField::new(field, "is required"))
        })?;
        super::convert::time_from_proto(field, value).map_err(status::invalid_field)
    };
    let from = instant("from", request.from.as_ref())?;
    let to = instant("to", request.to.as_ref())?;
    ReportPeriod::new(from, to, days_max).map_err(|error| status::from_report(error.into()))
}

/// Prepares the report (abandoned if the client leaves meanwhile), then sends the summary and
/// every row.
async fn stream_report(reporter: Reporter, period: ReportPeriod, sender: ChunkSender) {
    let run = reporter.new_run();
    let prepared = tokio::select! {
        prepared = reporter.prepare(run, period) => prepared,
        () = sender.closed() => {
            reporter.abandon(run).await;
            return;
        }
    };
    match prepared {
        Ok(report) => {
            send_report(&report, &sender).await;
            report.finish().await;
        }
        Err(error) => {
            let _ = sender.send(Err(status::from_report(error))).await;
        }
    }
}

async fn send_report(report: &PreparedReport, sender: &ChunkSender) {
    let summary = Item::Summary(summary_to_proto(report.summary()));
    if sender
        .send(Ok(proto::ReconciliationChunk {
            item: Some(summary),
        }))
        .await
        .is_err()
    {
        return;
    }
    let mut pages = report.rows();
    loop {
        let page = match pages.next_page().await {
            Ok(Some(page)) => page,
            Ok(None) => return,
            Err(error) => {
                let _ = sender.send(Err(status::from_report(error))).await;
                return;
            }
        };
        for row in &page {
            let chunk = proto::ReconciliationChunk {
                item: Some(Item::Row(row_to_proto(row))),
            };
            if sender.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
    }
}

fn category_to_proto(category: Category) -> proto::ReconciliationCategory {
    use proto::ReconciliationCategory as Proto;
    match category {
        Category::DoubleCharge => Proto::DoubleCharge,
        Category::MissingAtProvider => Proto::MissingAtProvider,
        Category::Orphan => Proto::Orphan,
        Category::AmountMismatch => Proto::AmountMismatch,
        Category::StatusMismatch => Proto::StatusMismatch,
        Category::StaleUnfinished => Proto::StaleUnfinished,
        Category::Expired => Proto::Expired,
        Category::RefundMismatch => Proto::RefundMismatch,
        Category::OrphanRefund => Proto::OrphanRefund,
        Category::RefundedBeyondRecord => Proto::RefundedBeyondRecord,
        Category::Disputed => Proto::Disputed,
        Category::InProgress => Proto::InProgress,
        Category::Matched => Proto::Matched,
    }
}

fn summary_to_proto(summary: &Summary) -> proto::ReconciliationSummary {
    let sources = &summary.sources;
    proto::ReconciliationSummary {
        period_from: Some(time_to_proto(summary.period.from())),
        period_to: Some(time_to_proto(summary.period.to())),
        generated_at: Some(time_to_proto(summary.generated_at)),
        rows: summary.rows,
        discrepancies: summary.discrepancies,
        categories: summary
            .categories
            .iter()
            .map(|(category, rows)| proto::ReconciliationCategoryCount {
                category: category_to_proto(*category) as i32,
                name: category.as_str().to_owned(),
                discrepancy: category.is_discrepancy(),
                rows: *rows,
            })
            .collect(),
        currencies: summary
            .currencies
            .iter()
            .map(|(currency, totals)| proto::ReconciliationCurrencyTotals {
                currency: currency.clone(),
                ours_succeeded_minor: totals.ours_succeeded_minor,
                ours_refunded_minor: totals.ours_refunded_minor,
                provider_succeeded_minor: totals.provider_succeeded_minor,
                provider_refunded_minor: totals.provider_refunded_minor,
            })
            .collect(),
        sources: Some(proto::ReconciliationSources {
            provider: sources.provider.clone(),
            provider_payments_listed: sources.provider_payments_listed,
            provider_refunds_listed: sources.provider_refunds_listed,
            provider_list_calls: sources.provider_list_calls,
            payments_listed_from: Some(time_to_proto(sources.payments_listed_from)),
            payments_listed_to: Some(time_to_proto(sources.payments_listed_to)),
            refunds_listed_from: Some(time_to_proto(sources.refunds_listed_from)),
            refunds_listed_to: Some(time_to_proto(sources.refunds_listed_to)),
            chargeguard_version: sources.chargeguard_version.to_owned(),
        }),
        pending_age_max_minutes: summary.pending_age_max_minutes,
        requires_action_age_max_minutes: summary.requires_action_age_max_minutes,
    }
}

fn row_to_proto(row: &ReportRow) -> proto::ReconciliationRow {
    proto::ReconciliationRow {
        seq: row.seq,
        category: category_to_proto(row.category) as i32,
        category_name: row.category.as_str().to_owned(),
        discrepancy: row.category.is_discrepancy(),
        detail: row.detail.clone(),
        attempt: row
            .attempt
            .as_ref()
            .map(|attempt| proto::ReconciledAttempt {
                attempt_id: attempt.id.to_string(),
                consumer: attempt.consumer.clone(),
                operation_key: attempt.operation_key.clone(),
                status: status_to_proto(attempt.status) as i32,
                currency: attempt.currency.clone(),
                amount_minor: attempt.amount_minor,
                provider_payment_id: attempt.provider_payment_id.clone().unwrap_or_default(),
                failure_code: attempt.failure_code.clone().unwrap_or_default(),
                review_reason: attempt.review_reason.clone().unwrap_or_default(),
                created_at: Some(time_to_proto(attempt.created_at)),
                refunded_minor: attempt.ours_refunded_minor,
            }),
        provider_objects_total: row.objects_total,
        provider_objects: row
            .objects
            .iter()
            .map(|object| proto::ReconciledPayment {
                id: object.id.clone(),
                status: object.status.clone(),
                currency: object.currency.clone(),
                amount_minor: object.amount_minor,
                amount_received_minor: object.amount_received_minor,
                refunded_minor: object.refunded_minor,
                created_at: Some(time_to_proto(object.created_at)),
                linked_by: object
                    .linked_by
                    .map(|linked| linked.as_str().to_owned())
                    .unwrap_or_default(),
            })
            .collect(),
    }
}
