use tonic::{Request, Response, Status};

use super::auth::Authenticator;
use super::proto::payments_server::Payments;
use super::{convert, proto, status};
use crate::orchestrator::Orchestrator;

pub struct PaymentsService {
    orchestrator: Orchestrator,
    authenticator: Authenticator,
}

impl PaymentsService {
    pub fn new(orchestrator: Orchestrator, authenticator: Authenticator) -> Self {
        Self { orchestrator, authenticator }
    }

    pub fn into_server(self) -> proto::payments_server::PaymentsServer<Self> {
        proto::payments_server::PaymentsServer::new(self)
    }
}

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn charge(&self, request: Request<proto::ChargeRequest>) -> Result<Response<proto::ChargeResponse>, Status> {
        let consumer = self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        let settings = self.orchestrator.settings();
        let charge = convert::charge_request(request.get_ref(), settings.amount_minor_max)
            .map_err(status::invalid_field)?;
        let reply = self.orchestrator.charge(&consumer, charge).await.map_err(status::from_orchestrator)?;
        Ok(Response::new(proto::ChargeResponse {
            attempt: Some(convert::attempt_to_proto(&reply.attempt)),
            outcome: convert::outcome_to_proto(reply.outcome) as i32,
        }))
    }

    async fn refund(&self, request: Request<proto::RefundRequest>) -> Result<Response<proto::RefundResponse>, Status> {
        let consumer = self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        let refund = convert::refund_request(request.get_ref()).map_err(status::invalid_field)?;
        let reply = self.orchestrator.refund(&consumer, refund).await.map_err(status::from_orchestrator)?;
        Ok(Response::new(proto::RefundResponse {
            attempt: Some(convert::attempt_to_proto(&reply.attempt)),
            outcome: convert::outcome_to_proto(reply.outcome) as i32,
        }))
    }

    async fn get_attempt(&self, request: Request<proto::GetAttemptRequest>) -> Result<Response<proto::GetAttemptResponse>, Status> {
        let consumer = self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        let selector = convert::selector(request.get_ref()).map_err(status::invalid_field)?;
        let attempt = self.orchestrator.get_attempt(&consumer, selector).await.map_err(status::from_orchestrator)?;
        let operation_attempts =
            self.orchestrator.operation_attempts(&consumer, &attempt).await.map_err(status::from_orchestrator)?;
        let totals = self.orchestrator.refund_totals(std::slice::from_ref(&attempt)).await.map_err(status::from_orchestrator)?;
        Ok(Response::new(proto::GetAttemptResponse {
            attempt: Some(convert::attempt_with_refunds(&attempt, totals.get(&attempt.id))),
            operation_attempts,
        }))
    }

    async fn list_attempts(&self, request: Request<proto::ListAttemptsRequest>) -> Result<Response<proto::ListAttemptsResponse>, Status> {
        let consumer = self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        let settings = self.orchestrator.settings();
        let body = request.get_ref();
        let filter = convert::list_filter(body).map_err(status::invalid_field)?;
        let page_size = convert::page_size(body.page_size, settings.list_page_size_default, settings.list_page_size_max)
            .map_err(status::invalid_field)?;
        let token = (!body.page_token.is_empty()).then_some(body.page_token.as_str());
        let page = self
            .orchestrator
            .list_attempts(&consumer, &filter, page_size, token)
            .await
            .map_err(status::from_orchestrator)?;
        let totals = self.orchestrator.refund_totals(&page.attempts).await.map_err(status::from_orchestrator)?;
        Ok(Response::new(proto::ListAttemptsResponse {
            attempts: page.attempts.iter().map(|attempt| convert::attempt_with_refunds(attempt, totals.get(&attempt.id))).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
        }))
    }
}
