//! What a load run measured: latency histograms and outcome counts, recorded per worker without
//! sharing, merged at the end, printed for people and as one JSON line for scripts.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::mix::CallKind;

/// Latencies are recorded in microseconds from 1 µs up to this bound; slower calls are clamped
/// to it (a request timeout is far below it).
const LATENCY_US_MAX: u64 = 600_000_000;
/// Three significant digits: 0.1 % relative error on every percentile.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_DIGITS)
        .expect("literal bounds are valid")
}

/// One worker's measurements. Workers never share one, so recording takes no lock.
#[derive(Debug, Clone)]
pub struct Recorder {
    all: Histogram<u64>,
    new: Histogram<u64>,
    duplicate: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
    sent_new: u64,
    sent_duplicate: u64,
    ok: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            all: new_histogram(),
            new: new_histogram(),
            duplicate: new_histogram(),
            outcomes: BTreeMap::new(),
            sent_new: 0,
            sent_duplicate: 0,
            ok: 0,
        }
    }
}

/// How one call ended, as counted in the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallResult {
    /// The service answered with an outcome (`applied`, `duplicate`, `reconciled`).
    Answered(&'static str),
    /// An error status: its gRPC code and chargeguard's error code, e.g. `unavailable/in_progress`.
    Failed(String),
}

impl Recorder {
    pub fn record(&mut self, kind: CallKind, latency: Duration, result: CallResult) {
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, LATENCY_US_MAX);
        self.all.saturating_record(micros);
        match kind {
            CallKind::New => {
                self.sent_new += 1;
                self.new.saturating_record(micros);
            }
            CallKind::Duplicate => {
                self.sent_duplicate += 1;
                self.duplicate.saturating_record(micros);
            }
        }
        let label = match result {
            CallResult::Answered(outcome) => {
                self.ok += 1;
                outcome.to_owned()
            }
            CallResult::Failed(label) => format!("error:{label}"),
        };
        *self.outcomes.entry(label).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Recorder) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.all.add(&other.all);
        let _ = self.new.add(&other.new);
        let _ = self.duplicate.add(&other.duplicate);
        for (label, count) in &other.outcomes {
            *self.outcomes.entry(label.clone()).or_default() += count;
        }
        self.sent_new += other.sent_new;
        self.sent_duplicate += other.sent_duplicate;
        self.ok += other.ok;
    }

    pub fn report(&self, run: RunDescription, elapsed: Duration) -> LoadReport {
        let requests = self.all.len();
        let seconds = elapsed.as_secs_f64();
        let per_second = |count: u64| {
            if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            }
        };
        LoadReport {
            run,
            elapsed_seconds: round3(seconds),
            requests,
            sent_new: self.sent_new,
            sent_duplicate: self.sent_duplicate,
            ok: self.ok,
            errors: requests - self.ok,
            requests_per_second: round3(per_second(requests)),
            ok_per_second: round3(per_second(self.ok)),
            latency_ms: LatencySummary::of(&self.all),
            latency_new_ms: LatencySummary::of(&self.new),
            latency_duplicate_ms: LatencySummary::of(&self.duplicate),
            outcomes: self.outcomes.clone(),
        }
    }
}

fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

/// Percentiles in milliseconds; `None` when nothing was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl LatencySummary {
    fn of(histogram: &Histogram<u64>) -> Option<Self> {
        if histogram.is_empty() {
            return None;
        }
        let ms = |micros: u64| round3(micros as f64 / 1_000.0);
        Some(Self {
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            p999: ms(histogram.value_at_quantile(0.999)),
            max: ms(histogram.max()),
            mean: round3(histogram.mean() / 1_000.0),
        })
    }
}

/// The run's shape, repeated in the report so a JSON line stands on its own.
#[derive(Debug, Clone, Serialize)]
pub struct RunDescription {
    pub label: String,
    pub concurrency: u32,
    pub connections: u32,
    pub duplicate_percent: u8,
    /// Keys charged before the measured phase, so duplicates have something to repeat.
    pub primed_keys: u64,
    pub warmup_seconds: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    #[serde(flatten)]
    pub run: RunDescription,
    pub elapsed_seconds: f64,
    /// Calls completed in the measured phase (answered or failed).
    pub requests: u64,
    pub sent_new: u64,
    pub sent_duplicate: u64,
    pub ok: u64,
    pub errors: u64,
    pub requests_per_second: f64,
    pub ok_per_second: f64,
    pub latency_ms: Option<LatencySummary>,
    pub latency_new_ms: Option<LatencySummary>,
    pub latency_duplicate_ms: Option<LatencySummary>,
    /// `applied`, `duplicate`, `reconciled`, or `error:<grpc code>/<chargeguard code>`.
    pub outcomes: BTreeMap<String, u64>,
}

impl LoadReport {
    /// One line of JSON, tagged so a script can find it among other output.
    pub fn json_line(&self) -> String {
        tagged_json_line("chargeguard_bench", self)
    }

    /// Calls were made and none was answered: the run measured failures.
    pub fn every_call_failed(&self) -> bool {
        self.requests > 0 && self.ok == 0
    }
}

/// `{"<tag>": <report>}` on one line: a script finds its report by the tag.
pub fn tagged_json_line(tag: &str, report: &impl Serialize) -> String {
    let body = serde_json::to_string(report).expect("a report always serializes");
    format!("{{\"{tag}\":{body}}}")
}

fn write_latency(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    latency: &Option<LatencySummary>,
) -> fmt::Result {
    match latency {
        Some(l) => writeln!(
            f,
            "  {name:<10} p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  mean {:.3} ms",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        ),
        None => Ok(()),
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = &self.run;
        writeln!(
            f,
            "bench {}: {} callers on {} connections, {:.1} s measured after {} s warm-up, {} % duplicates ({} keys primed)",
            run.label,
            run.concurrency,
            run.connections,
            self.elapsed_seconds,
            run.warmup_seconds,
            run.duplicate_percent,
            run.primed_keys
        )?;
        writeln!(
            f,
            "  requests   {} ({:.1}/s): ok {} ({:.1}/s), errors {}; sent new {}, duplicate {}",
            self.requests,
            self.requests_per_second,
            self.ok,
            self.ok_per_second,
            self.errors,
            self.sent_new,
            self.sent_duplicate
        )?;
        write_latency(f, "latency", &self.latency_ms)?;
        if self.sent_new > 0 && self.sent_duplicate > 0 {
            write_latency(f, "new", &self.latency_new_ms)?;
            write_latency(f, "duplicate", &self.latency_duplicate_ms)?;
        }
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(label, count)| format!("{label} {count}"))
            .collect();
        writeln!(f, "  outcomes   {}", outcomes.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunDescription {
        RunDescription {
            label: "t".into(),
            concurrency: 2,
            connections: 1,
            duplicate_percent: 50,
            primed_keys: 0,
            warmup_seconds: 0,
        }
    }

    #[test]
    fn merged_counts_add_up_and_percentiles_come_from_all_workers() {
        let mut first = Recorder::default();
        let mut second = Recorder::default();
        for n in 1..=99 {
            first.record(
                CallKind::New,
                Duration::from_millis(n),
                CallResult::Answered("applied"),
            );
        }
        second.record(
            CallKind::Duplicate,
            Duration::from_secs(2),
            CallResult::Answered("duplicate"),
        );
        second.record(
            CallKind::New,
            Duration::from_millis(1),
            CallResult::Failed("unavailable/in_progress".into()),
        );
        first.merge(&second);
        let report = first.report(run(), Duration::from_secs(10));
        assert_eq!(report.requests, 101);
        assert_eq!(report.sent_new + report.sent_duplicate, report.requests);
        assert_eq!(report.ok + report.errors, report.requests);
        assert_eq!(report.errors, 1);
        assert_eq!(report.outcomes.values().sum::<u64>(), report.requests);
        assert_eq!(report.outcomes["error:unavailable/in_progress"], 1);
        assert_eq!(report.ok_per_second, 10.0);
        let latency = report.latency_ms.unwrap();
        assert!((49.9..=50.1).contains(&latency.p50), "{latency:?}");
        assert!(latency.max >= 1_999.0, "{latency:?}");
        assert!(report.latency_duplicate_ms.unwrap().p50 >= 1_999.0);
    }

    #[test]
    fn the_json_line_is_tagged_and_flat_enough_for_a_script() {
        let mut recorder = Recorder::default();
        recorder.record(
            CallKind::New,
            Duration::from_millis(3),
            CallResult::Answered("applied"),
        );
        let line = recorder.report(run(), Duration::from_secs(1)).json_line();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        let body = &value["chargeguard_bench"];
        assert_eq!(body["label"], "t");
        assert_eq!(body["ok"], 1);
        assert_eq!(body["outcomes"]["applied"], 1);
        assert!(body["latency_ms"]["p99"].as_f64().unwrap() >= 2.9);
        assert!(body["latency_duplicate_ms"].is_null());
    }

    #[test]
    fn a_run_failed_only_when_calls_were_made_and_none_was_answered() {
        let report_of = |results: &[CallResult]| {
            let mut recorder = Recorder::default();
            for result in results {
                recorder.record(CallKind::New, Duration::from_millis(1), result.clone());
            }
            recorder.report(run(), Duration::from_secs(1))
        };
        let failed = || CallResult::Failed("unauthenticated".into());
        assert!(report_of(&[failed(), failed()]).every_call_failed());
        // A decline is an answer, and one answer among failures is a run that reached the service.
        assert!(!report_of(&[failed(), CallResult::Answered("declined")]).every_call_failed());
        assert!(!report_of(&[]).every_call_failed(), "no call, no failure");
    }
}
