//! Finding the token and opening the authenticated channel.

use std::path::Path;

use tonic::Status;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::{CONNECT_TIMEOUT, ClientArgs};
use crate::embedded::{DEMO_OPERATOR_TOKEN_FILE_DEFAULT, DEMO_TOKEN_FILE_DEFAULT, TokenFileError, read_token_file};
use crate::grpc::proto::payments_client::PaymentsClient;
use crate::grpc::proto::reports_client::ReportsClient;
use crate::secret::Secret;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Usage(String),
    #[error(
        "no token: set CHARGEGUARD_TOKEN, or pass --token-file FILE (a first-run server keeps its \
         demo token in {DEMO_TOKEN_FILE_DEFAULT} of its working directory, and its demo operator's \
         in {DEMO_OPERATOR_TOKEN_FILE_DEFAULT})"
    )]
    NoToken,
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    #[error("cannot reach chargeguard at {server}: {detail}")]
    Unreachable { server: String, detail: String },
    #[error("{}", .0.message())]
    Status(#[from] Status),
}

impl ClientError {
    /// Whether the same command is safe to send again (SEMANTICS.md: unknown is not failure).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Status(status) => status.code() == tonic::Code::Unavailable,
            ClientError::Usage(_) | ClientError::NoToken | ClientError::TokenFile(_) => false,
        }
    }
}

pub type Client = PaymentsClient<InterceptedService<Channel, Authorization>>;

/// Adds `authorization: Bearer …` to every call. The value is marked sensitive, so it is left
/// out of any debug output of the request.
#[derive(Clone)]
pub struct Authorization(AsciiMetadataValue);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub async fn client(args: &ClientArgs) -> Result<Client, ClientError> {
    let (channel, authorization) = channel(args, Path::new(DEMO_TOKEN_FILE_DEFAULT)).await?;
    Ok(PaymentsClient::with_interceptor(channel, authorization))
}

pub type OperatorClient = ReportsClient<InterceptedService<Channel, Authorization>>;

/// A `Reports` client for an operator: without `--token` or `--token-file`, the demo
/// operator's token of a first-run server started in this directory.
pub async fn operator_client(args: &ClientArgs) -> Result<OperatorClient, ClientError> {
    let (channel, authorization) = channel(args, Path::new(DEMO_OPERATOR_TOKEN_FILE_DEFAULT)).await?;
    Ok(ReportsClient::with_interceptor(channel, authorization))
}

async fn channel(args: &ClientArgs, default_token_file: &Path) -> Result<(Channel, Authorization), ClientError> {
    let token = token(args, default_token_file)?;
    let mut header: AsciiMetadataValue =
        MetadataValue::try_from(format!("Bearer {}", token.expose()))
            .map_err(|_| ClientError::Usage("the token must be printable ASCII".to_owned()))?;
    header.set_sensitive(true);
    let tls = args.tls.wanted(&args.server);
    let server = with_scheme(&args.server, tls);
    let unreachable = |detail: String| ClientError::Unreachable {
        server: server.clone(),
        detail,
    };
    let endpoint = Endpoint::from_shared(server.clone())
        .map_err(|error| ClientError::Usage(format!("--server {server:?} is not a URL: {error}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(std::time::Duration::from_millis(args.timeout_ms));
    let endpoint = if tls {
        let config = args.tls.client_config().map_err(ClientError::Usage)?;
        endpoint.tls_config(config).map_err(|error| ClientError::Usage(format!("TLS: {}", source_chain(&error))))?
    } else {
        endpoint
    };
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| unreachable(source_chain(&error)))?;
    Ok((channel, Authorization(header)))
}

/// `--token` (or CHARGEGUARD_TOKEN), else `--token-file` (or CHARGEGUARD_TOKEN_FILE), else the
/// demo token file of a first-run server in this directory (`default_file`).
fn token(args: &ClientArgs, default_file: &Path) -> Result<Secret, ClientError> {
    if let Some(token) = args.token.as_deref().filter(|token| !token.is_empty()) {
        return Ok(Secret::new(token));
    }
    if let Some(path) = &args.token_file {
        return Ok(read_token_file(path)?);
    }
    if default_file.exists() {
        return Ok(read_token_file(default_file)?);
    }
    Err(ClientError::NoToken)
}

/// `127.0.0.1:50051` means `http://127.0.0.1:50051`, or `https://…` with a TLS flag.
fn with_scheme(server: &str, tls: bool) -> String {
    match (server.contains("://"), tls) {
        (true, _) => server.to_owned(),
        (false, false) => format!("http://{server}"),
        (false, true) => format!("https://{server}"),
    }
}

/// tonic's transport errors say little at the top ("transport error"); the cause is below.
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
