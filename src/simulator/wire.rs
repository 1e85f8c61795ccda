//! Stripe's wire format: form-encoded parameters with bracket nesting (`metadata[order]=1`,
//! `created[gte]=…`, `expand[0]=…`) and the `{"error": {…}}` envelope.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Value, json};

/// Deepest bracket nesting accepted (`a[b][c]` is depth 3).
const PARAM_DEPTH_MAX: usize = 4;
/// Longest parameter name or scalar value accepted.
const PARAM_LENGTH_MAX: usize = 5_000;

/// One parameter value: a scalar or a nested map (arrays are maps keyed by index).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Param {
    Value(String),
    Map(BTreeMap<String, Param>),
}

/// Parsed request parameters. Handlers `take_*` what they understand and then call
/// [`Params::finish`], which rejects anything left over as Stripe does.
#[derive(Debug, Default)]
pub struct Params {
    entries: BTreeMap<String, Param>,
    fingerprint: String,
}

impl Params {
    /// Parses an `application/x-www-form-urlencoded` string (body or query string).
    pub fn parse(input: &str, params_max: usize) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(input).map_err(|_| {
            ApiError::invalid_request(None, "The request could not be decoded as form parameters.")
        })?;
        if pairs.len() > params_max {
            return Err(ApiError::invalid_request(
                None,
                format!("Too many parameters: at most {params_max} are accepted."),
            ));
        }
        let mut entries = BTreeMap::new();
        for (name, value) in pairs {
            if name.len() > PARAM_LENGTH_MAX || value.len() > PARAM_LENGTH_MAX {
                return Err(ApiError::invalid_request(None, "A parameter is too long."));
            }
            let path = split_name(&name)?;
            insert(&mut entries, &path, value, &name)?;
        }
        let fingerprint = serde_json::to_string(&entries).unwrap_or_default();
        Ok(Self {
            entries,
            fingerprint,
        })
    }

    /// A canonical rendering of every parameter, compared by the idempotency layer.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub fn take_string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.entries.remove(name) {
            None => Ok(None),
            Some(Param::Value(value)) => Ok(Some(value)),
            Some(Param::Map(_)) => Err(ApiError::invalid_request(
                Some(name),
                format!("Invalid string: {name} must be a string, not a hash."),
            )),
        }
    }

    pub fn take_required_string(&mut self, name: &str) -> Result<String, ApiError> {
        match self.take_string(name)? {
            Some(value) if !value.is_empty() => Ok(value),
            Some(_) => Err(ApiError::invalid_request(
                Some(name),
                format!("Invalid string: {name} cannot be empty."),
            )
            .with_code("parameter_invalid_empty")),
            None => Err(ApiError::missing(name)),
        }
    }

    pub fn take_i64(&mut self, name: &str) -> Result<Option<i64>, ApiError> {
        let Some(raw) = self.take_string(name)? else {
            return Ok(None);
        };
        raw.parse::<i64>().map(Some).map_err(|_| {
            ApiError::invalid_request(Some(name), format!("Invalid integer: {}", truncate(&raw)))
                .with_code("parameter_invalid_integer")
        })
    }

    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        let Some(raw) = self.take_string(name)? else {
            return Ok(None);
        };
        match raw.as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(ApiError::invalid_request(
                Some(name),
                format!("Invalid boolean: {}", truncate(&raw)),
            )),
        }
    }

    /// A map of string values (`metadata[key]=value`).
    pub fn take_string_map(
        &mut self,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ApiError> {
        match self.entries.remove(name) {
            None => Ok(None),
            // Stripe accepts `metadata=` (empty) as "no metadata".
            Some(Param::Value(value)) if value.is_empty() => Ok(Some(BTreeMap::new())),
            Some(Param::Value(_)) => Err(ApiError::invalid_request(
                Some(name),
                format!("Invalid object: {name} must be a hash of strings."),
            )),
            Some(Param::Map(map)) => {
                let mut out = BTreeMap::new();
                for (key, value) in map {
                    let Param::Value(value) = value else {
                        return Err(ApiError::invalid_request(
                            Some(&format!("{name}[{key}]")),
                            "Invalid value: nested objects are not allowed here.",
                        ));
                    };
                    out.insert(key, value);
                }
                Ok(Some(out))
            }
        }
    }

    /// A nested map whose values must be scalars (`created[gte]=…`), or a scalar.
    pub fn take_param(&mut self, name: &str) -> Option<Param> {
        self.entries.remove(name)
    }

    /// Drops a parameter the simulator accepts but does not model (`expand`).
    pub fn ignore(&mut self, name: &str) {
        self.entries.remove(name);
    }

    /// Rejects whatever parameter was not taken.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.entries.into_keys().next() {
            None => Ok(()),
            Some(name) => Err(ApiError::invalid_request(
                Some(&name),
                format!("Received unknown parameter: {name}"),
            )
            .with_code("parameter_unknown")),
        }
    }
}

fn truncate(raw: &str) -> &str {
    const SHOWN_CHARS_MAX: usize = 64;
    match raw.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((index, _)) => &raw[..index],
        None => raw,
    }
}

/// `metadata[order][x]` → `["metadata", "order", "x"]`.
fn split_name(name: &str) -> Result<Vec<&str>, ApiError> {
    let malformed =
        || ApiError::invalid_request(None, format!("Invalid parameter name: {}", truncate(name)));
    let (head, mut rest) = match name.find('[') {
        Some(index) => (&name[..index], &name[index..]),
        None => (name, ""),
    };
    if head.is_empty() {
        return Err(malformed());
    }
    let mut path = vec![head];
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[').ok_or_else(malformed)?;
        let close = inner.find(']').ok_or_else(malformed)?;
        path.push(&inner[..close]);
        rest = &inner[close + 1..];
        if path.len() > PARAM_DEPTH_MAX {
            return Err(ApiError::invalid_request(
                Some(head),
                "Parameters are nested too deeply.",
            ));
        }
    }
    Ok(path)
}

fn insert(
    map: &mut BTreeMap<String, Param>,
    path: &[&str],
    value: String,
    name: &str,
) -> Result<(), ApiError> {
    let conflict = || {
        ApiError::invalid_request(
            Some(name),
            format!("Conflicting values for parameter {}", truncate(name)),
        )
    };
    let (first, rest) = path.split_first().ok_or_else(conflict)?;
    // `a[]=x&a[]=y` appends: an empty segment takes the next index.
    let key = if first.is_empty() {
        map.len().to_string()
    } else {
        (*first).to_owned()
    };
    if rest.is_empty() {
        if map.contains_key(&key) {
            return Err(conflict());
        }
        map.insert(key, Param::Value(value));
        return Ok(());
    }
    match map
        .entry(key)
        .or_insert_with(|| Param::Map(BTreeMap::new()))
    {
        Param::Map(inner) => insert(inner, rest, value, name),
        Param::Value(_) => Err(conflict()),
    }
}

/// The `type` of a Stripe error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    InvalidRequest,
    Card,
    Idempotency,
    Api,
}

impl ErrorType {
    fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Card => "card_error",
            Self::Idempotency => "idempotency_error",
            Self::Api => "api_error",
        }
    }
}

/// A Stripe error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub error_type: ErrorType,
    pub code: Option<&'static str>,
    pub decline_code: Option<&'static str>,
    pub message: String,
    pub param: Option<String>,
    /// Boxed: only card errors carry it, and it keeps `Result<_, ApiError>` small.
    pub payment_intent: Option<Box<Value>>,
    pub charge: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, error_type: ErrorType, message: impl Into<String>) -> Self {
        Self {
            status,
            error_type,
            code: None,
            decline_code: None,
            message: message.into(),
            param: None,
            payment_intent: None,
            charge: None,
        }
    }

    pub fn invalid_request(param: Option<&str>, message: impl Into<String>) -> Self {
        let mut error = Self::new(400, ErrorType::InvalidRequest, message);
        error.param = param.map(str::to_owned);
        error
    }

    pub fn missing(param: &str) -> Self {
        Self::invalid_request(Some(param), format!("Missing required param: {param}."))
            .with_code("parameter_missing")
    }

    pub fn no_such(object: &str, id: &str, param: &str) -> Self {
        Self::invalid_request(Some(param), format!("No such {object}: '{}'", truncate(id)))
            .with_code("resource_missing")
    }

    /// The object named in the URL does not exist (404, as Stripe answers).
    pub fn not_found(object: &str, id: &str, param: &str) -> Self {
        let mut error = Self::no_such(object, id, param);
        error.status = 404;
        error
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorType::Api, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        let mut error = serde_json::Map::new();
        error.insert("type".into(), json!(self.error_type.as_str()));
        error.insert("message".into(), json!(self.message));
        if let Some(code) = self.code {
            error.insert("code".into(), json!(code));
            error.insert(
                "doc_url".into(),
                json!(format!(
                    "https://stripe.com/docs/error-codes/{}",
                    code.replace('_', "-")
                )),
            );
        }
        if let Some(decline_code) = self.decline_code {
            error.insert("decline_code".into(), json!(decline_code));
        }
        if let Some(param) = &self.param {
            error.insert("param".into(), json!(param));
        }
        if let Some(payment_intent) = &self.payment_intent {
            error.insert("payment_intent".into(), (**payment_intent).clone());
        }
        if let Some(charge) = &self.charge {
            error.insert("charge".into(), json!(charge));
        }
        json!({ "error": error })
    }

    pub fn into_stored(self) -> StoredResponse {
        StoredResponse::json(self.status, &self.body())
    }
}

/// A status and a JSON body: what the idempotency layer saves and replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Bytes,
}

impl StoredResponse {
    pub fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            body: Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
        }
    }

    pub fn ok(body: &Value) -> Self {
        Self::json(200, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Value) {
        let params = Params::parse(input, 256).expect("parses");
        assert_eq!(
            serde_json::from_str::<Value>(params.fingerprint()).unwrap(),
            expected
        );
    }

    #[test]
    fn parses_brackets_percent_encoding_and_arrays() {
        check(
            "amount=100&metadata%5Border%5D=a+b&metadata[x]=%26&created[gte]=5&expand[]=a&expand[]=b",
            json!({"amount":"100","metadata":{"order":"a b","x":"&"},"created":{"gte":"5"},"expand":{"0":"a","1":"b"}}),
        );
    }

    #[test]
    fn rejects_conflicts_and_malformed_names() {
        for input in [
            "a=1&a=2",
            "a=1&a[b]=2",
            "[x]=1",
            "a[b=1",
            "a[b]c=1",
            "a[1][2][3][4]=1",
        ] {
            assert!(Params::parse(input, 256).is_err(), "{input}");
        }
        assert!(Params::parse("a=1&b=2", 1).is_err());
    }

    #[test]
    fn unknown_parameters_are_named() {
        let mut params = Params::parse("amount=1&bogus=2", 256).unwrap();
        assert_eq!(params.take_i64("amount").unwrap(), Some(1));
        let error = params.finish().unwrap_err();
        assert_eq!(error.param.as_deref(), Some("bogus"));
        assert_eq!(error.code, Some("parameter_unknown"));
    }
}
