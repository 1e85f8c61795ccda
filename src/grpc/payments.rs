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
        // The refund work (issue 15) implements this; nothing is written or sent meanwhile.
        self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        Err(Status::unimplemented("Refund is not implemented yet"))
    }

    async fn get_attempt(&self, request: Request<proto::GetAttemptRequest>) -> Result<Response<proto::GetAttemptResponse>, Status> {
        let consumer = self.authenticator.authenticate(&request).map_err(status::unauthenticated)?;
        let selector = convert::selector(request.get_ref()).map_err(status::invalid_field)?;
        let attempt = self.orchestrator.get_attempt(&consumer, selector).await.map_err(status::from_orchestrator)?;
        // Counted by the attempt-number work (issue 16); until then an operation has one.
        Ok(Response::new(proto::GetAttemptResponse { attempt: Some(convert::attempt_to_proto(&attempt)), operation_attempts: 1 }))
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
        Ok(Response::new(proto::ListAttemptsResponse {
            attempts: page.attempts.iter().map(convert::attempt_to_proto).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
        }))
    }
}
