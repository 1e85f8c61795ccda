//! The finance page on the HTTP port: `GET /finance` (the reconciliation report of a period,
//! for people), `GET /finance/report.csv` and `/finance/report.json` (the same report as
//! `chargeguard report` writes it), and `GET /finance/login` (a one-time ticket from
//! `chargeguard finance-link` exchanged for a session cookie).
//!
//! Who may look: operators with the finance or admin role, by a session cookie (HttpOnly,
//! SameSite=Strict, `Secure` with TLS) or an `Authorization: Bearer` header — never by a
//! token in a URL. No credential, or one nobody holds, is 401; a consumer's token is 403.
//! Every route only reads (GET), so a forged cross-site request changes nothing; every answer
//! carries a Content-Security-Policy that allows nothing but the page's own style sheet, and
//! `Cache-Control: no-store`.

mod logins;
mod page;

use std::sync::LazyLock;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use chrono::{NaiveDate, Utc};
use tokio::sync::mpsc;

pub use logins::{Logins, SESSION_TTL, TICKET_TTL, Viewer};

use crate::config::OperatorRole;
use crate::grpc::{Authenticator, Operators};
use crate::report::render::{csv, json};
use crate::report::{PreparedReport, ReportError, ReportPeriod, Reporter};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "chargeguard_finance";
/// Where a login link points; the ticket is its `ticket` parameter.
pub const LOGIN_PATH: &str = "/finance/login";
/// Download chunks buffered between the report task and the client.
const CHUNKS_BUFFERED_MAX: usize = 16;
/// The longest search text kept (the rest is cut).
const SEARCH_CHARS_MAX: usize = 200;

/// Everything the routes need; cheap to clone.
#[derive(Clone)]
pub struct FinanceState {
    /// `None`: the page answers 503. `serve` always has a reporter now that both stores run
    /// reports; the unit tests of the page's guards use `None`.
    pub reporter: Option<Reporter>,
    pub logins: Logins,
    pub operators: Operators,
    pub consumers: Authenticator,
    /// The HTTP port speaks TLS: the cookie is `Secure`.
    pub secure_cookie: bool,
}

pub fn router(state: FinanceState) -> Router {
    Router::new()
        .route("/finance", get(finance_page))
        .route("/finance/report.csv", get(download_csv))
        .route("/finance/report.json", get(download_json))
        .route(LOGIN_PATH, get(login))
        .layer(axum::middleware::map_response(protect))
        .with_state(state)
}

/// Headers on every answer of these routes.
async fn protect(mut response: Response) -> Response {
    static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
        use base64::Engine;
        use sha2::Digest;
        let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(page::STYLE.as_bytes()));
        let policy = format!(
            "default-src 'none'; style-src 'sha256-{digest}'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        );
        HeaderValue::from_str(&policy).expect("a policy of ASCII characters")
    });
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, POLICY.clone());
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Why a request is not let in.
enum Refusal {
    /// 401: no credential, or one nobody holds (an unknown or expired session included).
    Unauthenticated(&'static str),
    /// 403: a consumer's token.
    Forbidden(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Unauthenticated(why) => message_page(
                StatusCode::UNAUTHORIZED,
                "Sign in",
                &format!("{why} Get a one-time link with `chargeguard finance-link` and open it here."),
            ),
            Refusal::Forbidden(why) => message_page(StatusCode::FORBIDDEN, "Not allowed", &why),
        }
    }
}

/// The operator a request comes from: a session cookie, else a bearer token.
fn authorize(state: &FinanceState, headers: &HeaderMap) -> Result<Viewer, Refusal> {
    if let Some(session) = session_cookie(headers) {
        return state
            .logins
            .session(&session)
            .ok_or(Refusal::Unauthenticated("Your session is unknown or has expired."));
    }
    let Some(authorization) = headers.get(header::AUTHORIZATION) else {
        return Err(Refusal::Unauthenticated("You are not signed in."));
    };
    if let Ok(token) = crate::grpc::bearer_token(authorization.as_bytes())
        && let Some((name, role)) = state.operators.find(token)
    {
        return match role {
            OperatorRole::Finance | OperatorRole::Admin => Ok(Viewer { operator: name.clone() }),
        };
    }
    match state.consumers.identify(Some(authorization.as_bytes()), None) {
        Ok(consumer) => Err(Refusal::Forbidden(format!(
            "Consumer {consumer} may not read reports: the finance page is for operators with the finance or admin role."
        ))),
        Err(_) => Err(Refusal::Unauthenticated("That token is not an operator's.")),
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_owned())
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    ticket: Option<String>,
}

/// Exchanges a ticket for a session cookie and sends the browser on to the page, so the ticket
/// is not left in the address bar or history as the page's address.
async fn login(State(state): State<FinanceState>, Query(query): Query<LoginQuery>) -> Response {
    let Some((session, viewer)) = query.ticket.as_deref().and_then(|ticket| state.logins.open_session(ticket)) else {
        return message_page(
            StatusCode::UNAUTHORIZED,
            "Link expired",
            "This login link is unknown, used or expired (a link works once, for a few minutes). Get a new one with `chargeguard finance-link`.",
        );
    };
    tracing::info!(operator = %viewer.operator, "finance session opened");
    let secure = if state.secure_cookie { "; Secure" } else { "" };
    let cookie = format!(
        "{SESSION_COOKIE}={}; Path=/finance; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        session.expose(),
        SESSION_TTL.as_secs()
    );
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/finance")]).into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(_) => message_page(StatusCode::INTERNAL_SERVER_ERROR, "Error", "The session could not be opened."),
    }
}

#[derive(serde::Deserialize)]
struct PeriodQuery {
    from: Option<String>,
    to: Option<String>,
    q: Option<String>,
}

impl PeriodQuery {
    /// Whole UTC days, both included; today when not given.
    fn days(&self) -> Result<(NaiveDate, NaiveDate), String> {
        let today = Utc::now().date_naive();
        let day = |name: &str, value: Option<&str>| match value.filter(|value| !value.is_empty()) {
            None => Ok(today),
            Some(value) => NaiveDate::parse_from_str(value, "%Y-%m-%d").map_err(|_| format!("{name} must be a date, YYYY-MM-DD")),
        };
        Ok((day("from", self.from.as_deref())?, day("to", self.to.as_deref())?))
    }
}

/// A page that says why a request cannot be answered.
struct Unanswerable(StatusCode, &'static str, String);

impl IntoResponse for Unanswerable {
    fn into_response(self) -> Response {
        message_page(self.0, self.1, &self.2)
    }
}

/// The reporter and the period of a request, or why not.
fn period_of(state: &FinanceState, query: &PeriodQuery) -> Result<(Reporter, NaiveDate, NaiveDate, ReportPeriod), Unanswerable> {
    let Some(reporter) = state.reporter.clone() else {
        return Err(Unanswerable(
            StatusCode::SERVICE_UNAVAILABLE,
            "Reports unavailable",
            "Reports are not available on this server.".to_owned(),
        ));
    };
    let (from, to) = query.days().map_err(|why| Unanswerable(StatusCode::BAD_REQUEST, "Bad period", why))?;
    let period = ReportPeriod::parse(&from.to_string(), &to.to_string(), reporter.settings().period_days_max)
        .map_err(|error| Unanswerable(StatusCode::BAD_REQUEST, "Bad period", error.to_string()))?;
    Ok((reporter, from, to, period))
}

async fn finance_page(State(state): State<FinanceState>, headers: HeaderMap, Query(query): Query<PeriodQuery>) -> Response {
    let (viewer, from, to, report) = match viewed_report(&state, &headers, &query).await {
        Ok(viewed) => viewed,
        Err(response) => return response,
    };
    let search: String = query.q.unwrap_or_default().trim().chars().take(SEARCH_CHARS_MAX).collect();
    let query = page::PageQuery { from, to, search };
    let rendered = page::render(&report, &query, &viewer.operator).await;
    report.finish().await;
    match rendered {
        Ok(html) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        Err(error) => report_error_page(error),
    }
}

/// What the page and the downloads both do first: who asks (401/403), for which period (400,
/// or 503 without a reporter), and the report prepared for it.
async fn viewed_report(
    state: &FinanceState,
    headers: &HeaderMap,
    query: &PeriodQuery,
) -> Result<(Viewer, NaiveDate, NaiveDate, PreparedReport), Response> {
    let viewer = authorize(state, headers).map_err(IntoResponse::into_response)?;
    let (reporter, from, to, period) = period_of(state, query).map_err(IntoResponse::into_response)?;
    let report = prepare(&reporter, period, &viewer).await?;
    Ok((viewer, from, to, report))
}

async fn prepare(reporter: &Reporter, period: ReportPeriod, viewer: &Viewer) -> Result<PreparedReport, Response> {
    tracing::info!(operator = %viewer.operator, from = %period.from(), to = %period.to(), "finance report requested");
    let run = reporter.new_run();
    reporter.prepare(run, period).await.map_err(report_error_page)
}

fn report_error_page(error: ReportError) -> Response {
    match error {
        ReportError::Period(error) => message_page(StatusCode::BAD_REQUEST, "Bad period", &error.to_string()),
        ReportError::Provider { .. } | ReportError::TooManyPages { .. } => {
            tracing::warn!(%error, "finance report failed at the provider");
            message_page(StatusCode::BAD_GATEWAY, "Provider unavailable", "The provider's list did not answer in full; try again.")
        }
        ReportError::Store(_) => {
            tracing::error!(%error, "finance report failed in the database");
            message_page(StatusCode::SERVICE_UNAVAILABLE, "Database unavailable", "The report could not be read; try again.")
        }
    }
}

#[derive(Clone, Copy)]
enum Download {
    Csv,
    Json,
}

async fn download_csv(state: State<FinanceState>, headers: HeaderMap, query: Query<PeriodQuery>) -> Response {
    download(state, headers, query, Download::Csv).await
}

async fn download_json(state: State<FinanceState>, headers: HeaderMap, query: Query<PeriodQuery>) -> Response {
    download(state, headers, query, Download::Json).await
}

/// The report as a file, written page by page as the client reads it.
async fn download(State(state): State<FinanceState>, headers: HeaderMap, Query(query): Query<PeriodQuery>, format: Download) -> Response {
    let (_, from, to, report) = match viewed_report(&state, &headers, &query).await {
        Ok(viewed) => viewed,
        Err(response) => return response,
    };
    let (content_type, extension) = match format {
        Download::Csv => ("text/csv; charset=utf-8", "csv"),
        Download::Json => ("application/json", "json"),
    };
    let (sender, receiver) = mpsc::channel(CHUNKS_BUFFERED_MAX);
    tokio::spawn(write_download(report, format, sender));
    let disposition = format!("attachment; filename=\"chargeguard-reconciliation-{from}-to-{to}.{extension}\"");
    (
        [(header::CONTENT_TYPE, content_type.to_owned()), (header::CONTENT_DISPOSITION, disposition)],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver)),
    )
        .into_response()
}

type ChunkSender = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// Sends one chunk per page of rows; stops (and the report's staging is deleted) when the
/// client goes away. An error mid-way cuts the body short, so a partial file is never taken
/// for a whole one.
async fn write_download(report: PreparedReport, format: Download, sender: ChunkSender) {
    let mut buffer = Vec::new();
    let started = match format {
        Download::Csv => csv::write_header(&mut buffer),
        Download::Json => json::write_start(&mut buffer, report.summary()),
    };
    if started.is_err() {
        return;
    }
    let mut first = true;
    let mut pages = report.rows();
    loop {
        let page = match pages.next_page().await {
            Ok(Some(page)) => page,
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(%error, "finance download cut short");
                let _ = sender.send(Err(std::io::Error::other("report failed"))).await;
                return;
            }
        };
        for row in &page {
            // Writing to a Vec cannot fail.
            let _ = match format {
                Download::Csv => csv::write_row(&mut buffer, row),
                Download::Json => json::write_row(&mut buffer, row, first),
            };
            first = false;
        }
        if sender.send(Ok(Bytes::from(std::mem::take(&mut buffer)))).await.is_err() {
            return;
        }
    }
    if let Download::Json = format {
        let _ = json::write_end(&mut buffer);
    }
    if sender.send(Ok(Bytes::from(buffer))).await.is_ok() {
        report.finish().await;
    }
}

/// A small page that says one thing, with `status`.
fn message_page(status: StatusCode, title: &str, message: &str) -> Response {
    use crate::report::render::html::escape;
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>chargeguard: {0}</title>\
         <style>{1}</style></head><body><h1>{0}</h1><p id=\"message\">{2}</p></body></html>\n",
        escape(title),
        page::STYLE,
        escape(message)
    );
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OperatorConfig;
    use tower::ServiceExt;

    const TOKEN: &str = "finance-unit-token";

    fn state_without_reports() -> FinanceState {
        let operator = OperatorConfig {
            name: "finance".into(),
            token_sha256: crate::grpc::hash_token(TOKEN).into(),
            role: OperatorRole::Finance,
        };
        FinanceState {
            reporter: None,
            logins: Logins::default(),
            operators: Operators::from_config(&[operator]),
            consumers: Authenticator::from_config(&[]).unwrap(),
            secure_cookie: false,
        }
    }

    async fn get(state: FinanceState, path: &str, authorization: Option<&str>) -> Response {
        let mut request = axum::http::Request::get(path);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        router(state).oneshot(request.body(Body::empty()).unwrap()).await.unwrap()
    }

    #[tokio::test]
    async fn without_a_reporter_an_operator_gets_a_503_page_and_a_stranger_a_401() {
        let state = state_without_reports();
        let unavailable = get(state.clone(), "/finance", Some(&format!("Bearer {TOKEN}"))).await;
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(unavailable.headers()[header::CACHE_CONTROL], "no-store");
        let download = get(state.clone(), "/finance/report.csv", Some(&format!("Bearer {TOKEN}"))).await;
        assert_eq!(download.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(state.clone(), "/finance", None).await.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(get(state, "/finance", Some("Bearer guessed")).await.status(), StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn the_policy_allows_only_the_page_style_sheet() {
        let response = get(state_without_reports(), "/finance", None).await;
        let policy = response.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().to_owned();
        use base64::Engine;
        use sha2::Digest;
        let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(page::STYLE.as_bytes()));
        assert!(policy.contains(&format!("style-src 'sha256-{digest}'")), "{policy}");
        assert!(!policy.contains("script-src"), "default-src 'none' forbids scripts: {policy}");
    }
}
