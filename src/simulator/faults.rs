//! Fault injection: what goes wrong, on which endpoint, and when.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// A `/v1` endpoint of the simulator, named as faults and the request log name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    CreatePaymentIntent,
    RetrievePaymentIntent,
    CancelPaymentIntent,
    ConfirmPaymentIntent,
    ListPaymentIntents,
    SearchPaymentIntents,
    CreateRefund,
    RetrieveRefund,
    ListRefunds,
}

impl Endpoint {
    pub const ALL: [Endpoint; 9] = [
        Self::CreatePaymentIntent,
        Self::RetrievePaymentIntent,
        Self::CancelPaymentIntent,
        Self::ConfirmPaymentIntent,
        Self::ListPaymentIntents,
        Self::SearchPaymentIntents,
        Self::CreateRefund,
        Self::RetrieveRefund,
        Self::ListRefunds,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreatePaymentIntent => "create_payment_intent",
            Self::RetrievePaymentIntent => "retrieve_payment_intent",
            Self::CancelPaymentIntent => "cancel_payment_intent",
            Self::ConfirmPaymentIntent => "confirm_payment_intent",
            Self::ListPaymentIntents => "list_payment_intents",
            Self::SearchPaymentIntents => "search_payment_intents",
            Self::CreateRefund => "create_refund",
            Self::RetrieveRefund => "retrieve_refund",
            Self::ListRefunds => "list_refunds",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which endpoints a fault applies to: one, or every one (`*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum FaultTarget {
    All,
    Endpoint(Endpoint),
}

impl From<Endpoint> for FaultTarget {
    fn from(endpoint: Endpoint) -> Self {
        Self::Endpoint(endpoint)
    }
}

impl fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("*"),
            Self::Endpoint(endpoint) => f.write_str(endpoint.as_str()),
        }
    }
}

impl FromStr for FaultTarget {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        if name == "*" {
            return Ok(Self::All);
        }
        Endpoint::ALL
            .into_iter()
            .find(|endpoint| endpoint.as_str() == name)
            .map(Self::Endpoint)
            .ok_or_else(|| format!("unknown endpoint {name:?}"))
    }
}

impl TryFrom<String> for FaultTarget {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        name.parse()
    }
}

impl From<FaultTarget> for String {
    fn from(target: FaultTarget) -> String {
        target.to_string()
    }
}

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The request is executed normally after this many milliseconds (while its idempotency
    /// key is held, so a concurrent request with the key gets 409).
    Latency(u64),
    /// 500, nothing applied, nothing saved under the idempotency key.
    FailBeforeApply,
    /// 500 once execution began, nothing applied, and the 500 saved under the key: every later
    /// request with the key replays it (Stripe API v1 saves 500s too).
    FailSaved,
    /// Applied and saved under the key (a retry replays the real answer), then 500.
    ApplyThenFail,
    /// Applied, then 500, and the 500 (not the applied result) saved under the key: the object
    /// exists, but every later request with the key replays the 500.
    ApplyThenFailSaved,
    /// Applied and saved under the key, then the TCP connection is dropped with no response.
    ApplyThenDrop,
    /// Each firing one of the faults a provider shows in daily life, chosen by the seeded RNG
    /// with equal odds: 500 before applying, applied then 500, applied then the connection
    /// dropped, or this many milliseconds of latency (a timeout for a caller that waits less,
    /// 409 for a concurrent request with the key). The saved-500 faults are left out: they
    /// hold a key until it expires, which a long test (the chaos test) cannot wait for.
    Mixed(u64),
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Latency(_) => "latency",
            Self::FailBeforeApply => "fail_before_apply",
            Self::FailSaved => "fail_saved",
            Self::ApplyThenFail => "apply_then_fail",
            Self::ApplyThenFailSaved => "apply_then_fail_saved",
            Self::ApplyThenDrop => "apply_then_drop",
            Self::Mixed(_) => "mixed",
        }
    }

    /// The fault that fires: a mixed one resolved to one of its kinds.
    fn resolve(self, rng: &mut ChaCha8Rng) -> Self {
        match self {
            Self::Mixed(latency_ms) => match rng.gen_range(0..4) {
                0 => Self::FailBeforeApply,
                1 => Self::ApplyThenFail,
                2 => Self::ApplyThenDrop,
                _ => Self::Latency(latency_ms),
            },
            kind => kind,
        }
    }
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTrigger {
    /// The next `count` matching requests.
    Next(u32),
    /// Each matching request with this probability, drawn from the seeded RNG.
    Probability(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FaultSpec {
    pub kind: FaultKind,
    pub trigger: FaultTrigger,
}

impl FaultSpec {
    pub fn next(kind: FaultKind, count: u32) -> Self {
        Self {
            kind,
            trigger: FaultTrigger::Next(count),
        }
    }

    pub fn probability(kind: FaultKind, probability: f64) -> Self {
        Self {
            kind,
            trigger: FaultTrigger::Probability(probability),
        }
    }
}

#[derive(Debug)]
struct FaultRule {
    target: FaultTarget,
    spec: FaultSpec,
}

/// The installed faults. A rule for the endpoint wins over a `*` rule.
#[derive(Debug)]
pub struct FaultTable {
    rules: Vec<FaultRule>,
    /// How often each kind fired since the start (the chaos test's provider-fault figure).
    fired: std::collections::BTreeMap<&'static str, u64>,
    rules_max: usize,
    latency_ms_max: u64,
}

impl FaultTable {
    pub fn new(rules_max: usize, latency_ms_max: u64) -> Self {
        Self {
            rules: Vec::new(),
            fired: std::collections::BTreeMap::new(),
            rules_max,
            latency_ms_max,
        }
    }

    /// Installs (or replaces) the rule for `target`.
    pub fn set(&mut self, target: FaultTarget, spec: FaultSpec) -> Result<(), String> {
        match spec.trigger {
            FaultTrigger::Next(0) => return Err("a fault must fire at least once".into()),
            FaultTrigger::Probability(p) if !(0.0..=1.0).contains(&p) => {
                return Err("probability must be within 0..=1".into());
            }
            _ => {}
        }
        if let FaultKind::Latency(ms) | FaultKind::Mixed(ms) = spec.kind
            && ms > self.latency_ms_max
        {
            return Err(format!("latency is limited to {} ms", self.latency_ms_max));
        }
        self.rules.retain(|rule| rule.target != target);
        if self.rules.len() >= self.rules_max {
            return Err(format!("at most {} fault rules", self.rules_max));
        }
        self.rules.push(FaultRule { target, spec });
        Ok(())
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    pub fn list(&self) -> Vec<(FaultTarget, FaultSpec)> {
        self.rules
            .iter()
            .map(|rule| (rule.target, rule.spec))
            .collect()
    }

    /// Decides whether this request of `endpoint` gets a fault, consuming a `Next` count.
    pub fn draw(&mut self, endpoint: Endpoint, rng: &mut ChaCha8Rng) -> Option<FaultKind> {
        let index = self
            .rules
            .iter()
            .position(|rule| rule.target == FaultTarget::Endpoint(endpoint))
            .or_else(|| {
                self.rules
                    .iter()
                    .position(|rule| rule.target == FaultTarget::All)
            })?;
        let rule = &mut self.rules[index];
        let kind = rule.spec.kind;
        let fires = match &mut rule.spec.trigger {
            FaultTrigger::Next(count) => {
                *count -= 1;
                if *count == 0 {
                    self.rules.remove(index);
                }
                true
            }
            FaultTrigger::Probability(p) => rng.gen_bool(*p),
        };
        let fired = fires.then(|| kind.resolve(rng))?;
        *self.fired.entry(fired.name()).or_default() += 1;
        Some(fired)
    }

    /// How often each kind of fault fired, by name.
    pub fn fired(&self) -> &std::collections::BTreeMap<&'static str, u64> {
        &self.fired
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn next_count_is_consumed_and_endpoint_rule_wins() {
        let mut table = FaultTable::new(8, 1000);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        table
            .set(
                FaultTarget::All,
                FaultSpec::next(FaultKind::ApplyThenFail, 5),
            )
            .unwrap();
        table
            .set(
                Endpoint::CreateRefund.into(),
                FaultSpec::next(FaultKind::FailBeforeApply, 1),
            )
            .unwrap();
        assert_eq!(
            table.draw(Endpoint::CreateRefund, &mut rng),
            Some(FaultKind::FailBeforeApply)
        );
        assert_eq!(
            table.draw(Endpoint::CreateRefund, &mut rng),
            Some(FaultKind::ApplyThenFail)
        );
        assert_eq!(
            table.list(),
            vec![(
                FaultTarget::All,
                FaultSpec::next(FaultKind::ApplyThenFail, 4)
            )]
        );
    }

    #[test]
    fn a_mixed_fault_fires_each_of_its_kinds_and_counts_them() {
        let mut table = FaultTable::new(8, 1000);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        table.set(FaultTarget::All, FaultSpec::probability(FaultKind::Mixed(700), 1.0)).unwrap();
        let drawn: std::collections::BTreeSet<&str> =
            (0..200).filter_map(|_| table.draw(Endpoint::CreatePaymentIntent, &mut rng)).map(FaultKind::name).collect();
        assert_eq!(drawn, ["apply_then_drop", "apply_then_fail", "fail_before_apply", "latency"].into());
        assert_eq!(table.fired().values().sum::<u64>(), 200);
        assert!(table.set(FaultTarget::All, FaultSpec::probability(FaultKind::Mixed(1001), 0.1)).is_err());
    }

    #[test]
    fn probability_draws_repeat_with_the_seed() {
        let draws = |seed| {
            let mut table = FaultTable::new(8, 1000);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            table
                .set(
                    FaultTarget::All,
                    FaultSpec::probability(FaultKind::FailBeforeApply, 0.5),
                )
                .unwrap();
            (0..64)
                .map(|_| {
                    table
                        .draw(Endpoint::CreatePaymentIntent, &mut rng)
                        .is_some()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert!(draws(7).contains(&true) && draws(7).contains(&false));
    }

    #[test]
    fn kinds_are_named_in_snake_case_on_the_wire() {
        for (kind, name) in [
            (FaultKind::FailSaved, "\"fail_saved\""),
            (FaultKind::ApplyThenFailSaved, "\"apply_then_fail_saved\""),
        ] {
            assert_eq!(serde_json::to_string(&kind).unwrap(), name);
            assert_eq!(serde_json::from_str::<FaultKind>(name).unwrap(), kind);
        }
    }

    #[test]
    fn rejects_bad_specs() {
        let mut table = FaultTable::new(8, 1000);
        assert!(
            table
                .set(
                    FaultTarget::All,
                    FaultSpec::next(FaultKind::FailBeforeApply, 0)
                )
                .is_err()
        );
        assert!(
            table
                .set(
                    FaultTarget::All,
                    FaultSpec::probability(FaultKind::FailBeforeApply, 1.5)
                )
                .is_err()
        );
        assert!(
            table
                .set(
                    FaultTarget::All,
                    FaultSpec::next(FaultKind::Latency(1001), 1)
                )
                .is_err()
        );
        assert_eq!("*".parse::<FaultTarget>(), Ok(FaultTarget::All));
        assert!("create_charge".parse::<FaultTarget>().is_err());
    }
}
