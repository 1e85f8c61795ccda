//! The period a report covers: half-open `[from, to)`, parsed from the command line's dates.

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};

/// `[from, to)`, from before to, no longer than the configured maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportPeriod {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    #[error(
        "{field}: {value:?} is neither a date (2026-12-01) nor an RFC 3339 instant (2026-12-01T00:00:00Z)"
    )]
    Unreadable { field: &'static str, value: String },
    #[error("the period is empty: --from must be before --to")]
    Empty,
    #[error("the period is longer than {days_max} days (report.period_days_max)")]
    TooLong { days_max: u32 },
}

/// Which end of the period a date names: a date as `--to` includes that whole day.
#[derive(Debug, Clone, Copy)]
enum End {
    From,
    To,
}

impl ReportPeriod {
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>, days_max: u32) -> Result<Self, PeriodError> {
        if from >= to {
            return Err(PeriodError::Empty);
        }
        if to - from > chrono::Duration::days(i64::from(days_max)) {
            return Err(PeriodError::TooLong { days_max });
        }
        Ok(Self { from, to })
    }

    /// Dates are whole UTC days, both included: `--from 2026-12-01 --to 2026-12-01` is one day.
    /// RFC 3339 instants are taken as they are, `to` excluded.
    pub fn parse(from: &str, to: &str, days_max: u32) -> Result<Self, PeriodError> {
        Self::new(
            parse_end("from", from, End::From)?,
            parse_end("to", to, End::To)?,
            days_max,
        )
    }

    pub fn from(&self) -> DateTime<Utc> {
        self.from
    }

    /// Excluded.
    pub fn to(&self) -> DateTime<Utc> {
        self.to
    }

    pub fn contains(&self, instant: DateTime<Utc>) -> bool {
        self.from <= instant && instant < self.to
    }
}

fn parse_end(field: &'static str, value: &str, end: End) -> Result<DateTime<Utc>, PeriodError> {
    let value = value.trim();
    if let Ok(instant) = DateTime::parse_from_rfc3339(value) {
        return Ok(instant.with_timezone(&Utc));
    }
    let unreadable = || PeriodError::Unreadable {
        field,
        value: value.to_owned(),
    };
    let date = NaiveDate::parse_from_str(value, "%Y-%m-%d").map_err(|_| unreadable())?;
    let date = match end {
        End::From => date,
        End::To => date.succ_opt().ok_or_else(unreadable)?,
    };
    Ok(date.and_time(NaiveTime::MIN).and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(value: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(value)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn dates_cover_whole_days_both_included() {
        let period = ReportPeriod::parse("2026-12-01", "2026-12-01", 31).unwrap();
        assert_eq!(period.from(), at("2026-12-01T00:00:00Z"));
        assert_eq!(period.to(), at("2026-12-02T00:00:00Z"));
        assert!(period.contains(at("2026-12-01T23:59:59.999Z")));
        assert!(!period.contains(at("2026-12-02T00:00:00Z")));
    }

    #[test]
    fn instants_are_taken_as_given_with_to_excluded() {
        let period =
            ReportPeriod::parse("2026-12-01T10:00:00+01:00", "2026-12-01T12:00:00Z", 1).unwrap();
        assert_eq!(period.from(), at("2026-12-01T09:00:00Z"));
        assert!(!period.contains(at("2026-12-01T12:00:00Z")));
    }

    #[test]
    fn rejects_empty_long_and_unreadable_periods() {
        assert_eq!(
            ReportPeriod::parse("2026-12-02", "2026-12-01", 31),
            Err(PeriodError::Empty)
        );
        assert_eq!(
            ReportPeriod::parse("2026-01-01", "2026-12-31", 31),
            Err(PeriodError::TooLong { days_max: 31 })
        );
        assert!(matches!(
            ReportPeriod::parse("yesterday", "2026-12-01", 31),
            Err(PeriodError::Unreadable { field: "from", .. })
        ));
    }
}
