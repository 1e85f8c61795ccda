//! `chargeguard finance-link`: asks the server (`Reports.CreateFinanceLogin`, as an operator)
//! for a one-time login link to the finance page and prints it. The operator's token travels
//! in the gRPC metadata only; the link carries a short-lived single-use ticket instead.

use std::process::ExitCode;

use super::connect::{self, ClientError};
use super::{ClientArgs, finish};
use crate::grpc::proto;

#[derive(Debug, clap::Args)]
pub struct FinanceLinkArgs {
    /// How to reach the server. The token must be an operator's (finance or admin role);
    /// without --token or --token-file, a first-run server's demo operator token
    /// (chargeguard-data/demo-operator-token) is used.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The HTTP port's base URL as the browser reaches it, e.g. https://chargeguard.internal.
    /// By default the --server host with the HTTP port and scheme the server reports.
    #[arg(long, env = "CHARGEGUARD_HTTP_URL")]
    pub http_url: Option<String>,
}

pub async fn finance_link(args: FinanceLinkArgs) -> ExitCode {
    let json = args.client.json;
    let result = async {
        let mut client = connect::operator_client(&args.client).await?;
        let response = client.create_finance_login(proto::FinanceLoginRequest {}).await?.into_inner();
        let base = match &args.http_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => http_base(&args.client.server, &response)?,
        };
        Ok::<_, ClientError>((format!("{base}{}", response.path), response))
    }
    .await;
    finish(result, |(link, response)| match json {
        true => serde_json::json!({
            "link": link,
            "operator": response.operator,
            "expires_in_seconds": response.expires_in_seconds,
        })
        .to_string(),
        false => format!(
            "{link}\n\nOpen it in your browser within {} minutes, once, to see the finance page as {}.",
            response.expires_in_seconds.div_ceil(60),
            response.operator
        ),
    })
}

/// The --server host, with the HTTP port and scheme the server reported.
fn http_base(server: &str, response: &proto::FinanceLoginResponse) -> Result<String, ClientError> {
    let with_scheme = match server.contains("://") {
        true => server.to_owned(),
        false => format!("http://{server}"),
    };
    let uri: http::Uri = with_scheme
        .parse()
        .map_err(|_| ClientError::Usage(format!("--server {server:?} is not a URL; pass --http-url")))?;
    let host = uri
        .host()
        .ok_or_else(|| ClientError::Usage(format!("--server {server:?} names no host; pass --http-url")))?;
    let scheme = if response.http_tls { "https" } else { "http" };
    Ok(format!("{scheme}://{host}:{}", response.http_port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(tls: bool) -> proto::FinanceLoginResponse {
        proto::FinanceLoginResponse { path: "/finance/login?ticket=t".into(), http_port: 8080, http_tls: tls, ..Default::default() }
    }

    #[test]
    fn the_link_takes_the_grpc_host_and_the_reported_http_port() {
        assert_eq!(http_base("http://127.0.0.1:50051", &response(false)).unwrap(), "http://127.0.0.1:8080");
        assert_eq!(http_base("pay.internal:50051", &response(true)).unwrap(), "https://pay.internal:8080");
        assert_eq!(http_base("http://[::1]:50051", &response(false)).unwrap(), "http://[::1]:8080");
    }
}
