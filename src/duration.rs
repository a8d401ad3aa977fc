//! Durations as users write them (`90s`, `30m`, `2h30m`, `7d`, `2w`),
//! parsed by humantime, each kind of flag with its own accepted range.
//!
//! Every duration flag names one of the ranges below as its clap value
//! parser and states the same range in its help (`[range: 1m to 7d]`); a
//! test reads the help of every duration flag and checks the stated bounds
//! against the parser, so the two cannot drift apart.

use std::time::Duration;

/// The wait before try `attempt + 1` (`attempt` from 1) of something
/// retried: `first`, doubling up to `max`, with jitter in [50 %, 100 %] of
/// the step so callers failing together do not come back together.
pub fn backoff(first: Duration, max: Duration, attempt: u32) -> Duration {
    let step = first.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(max);
    step.mul_f64(0.5 + 0.5 * unit_random())
}

/// A number in [0, 1) that differs between calls (jitter, not security).
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A duration flag's accepted range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationIn {
    pub min: Duration,
    pub max: Duration,
    /// Why the maximum is what it is, for the error message.
    pub why_max: &'static str,
}

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 86_400;

const fn secs(min: u64, max: u64, why_max: &'static str) -> DurationIn {
    DurationIn {
        min: Duration::from_secs(min),
        max: Duration::from_secs(max),
        why_max,
    }
}

/// How long a pause lasts at most if hcp-dr dies mid-run.
pub const PAUSE_TTL: DurationIn = secs(MINUTE, 7 * DAY, "a pause nobody comes back to must end within a week");
/// `cluster pause --for`: an operator's deliberate pause.
pub const PAUSE_FOR: DurationIn = secs(MINUTE, 366 * DAY, "pause for at most a year; `fence` is for a copy that must never start");
/// How long to wait for pods to go or come back.
pub const WAIT: DurationIn = secs(10, 6 * HOUR, "no pod takes longer to stop or start");
/// How long to wait for an etcd member to rejoin, catch up or be restored.
pub const MEMBER_WAIT: DurationIn = secs(30, DAY, "a member that has not caught up within a day needs a person");
/// How long to wait for a hosted cluster to become Available (or go away).
pub const AVAILABLE_WAIT: DurationIn = secs(10, DAY, "a cluster that is not Available within a day needs a person");
/// How long the HyperShift operator has to acknowledge a pause.
pub const OPERATOR_ACK: DurationIn = secs(1, HOUR, "the operator either answers in seconds or is down");
/// The lifetime of a presigned snapshot URL: long enough for etcd to start
/// downloading.
pub const PRESIGN_TTL: DurationIn = secs(5 * MINUTE, 7 * DAY, "S3 presigned URLs live at most 7 days (SigV4)");
/// How long an idle data mover waits before it exits.
pub const MOVER_IDLE: DurationIn = secs(MINUTE, DAY, "a mover nobody talks to for a day is orphaned");
/// How long to wait for DNS records to move or propagate.
/// How long a seeding pod may stay unschedulable, or its claim unbound.
pub const SEED_GRACE: DurationIn = secs(5, 6 * HOUR, "a pod no node takes within hours needs a person");
pub const DNS_WAIT: DurationIn = secs(10, DAY, "DNS that has not moved within a day will not");
/// How old a complete backup may get before `backups prune --max-age` removes it.
pub const RETENTION_AGE: DurationIn = secs(HOUR, 36_500 * DAY, "no backup is older than a century");
/// `report --drill-every`: how often each cluster should be drilled.
pub const DRILL_EVERY: DurationIn = secs(HOUR, 366 * DAY, "a drill a year is the least an audit accepts");
/// `report --rto-target`: the longest a restore may take.
pub const RTO_TARGET: DurationIn = secs(10, 7 * DAY, "a recovery that may take more than a week is not a target");
/// `backup --lock-for`: how long S3 Object Lock keeps each object of a backup.
pub const LOCK_FOR: DurationIn = secs(1, 36_500 * DAY, "no backup is kept for more than a century");
/// How old an incomplete backup must be before prune treats it as abandoned.
pub const INCOMPLETE_AFTER: DurationIn = secs(HOUR, 36_500 * DAY, "no backup is older than a century");

impl DurationIn {
    /// Parse `text` and check it is in range; the error says what is accepted.
    pub fn check(&self, text: &str) -> Result<Duration, String> {
        let trimmed = text.trim();
        let d = match humantime::parse_duration(trimmed) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => {
                return Err(format!("`{text}` is too long: at most {} ({})", show(self.max), self.why_max));
            }
            Err(e) => return Err(format!("`{text}` is not a duration ({e}): write e.g. 90s, 30m, 2h30m or 7d, from {}", self.range())),
        };
        if d < self.min {
            return Err(format!("`{text}` is too short: from {}", self.range()));
        }
        if d > self.max {
            return Err(format!("`{text}` is too long: at most {} ({})", show(self.max), self.why_max));
        }
        Ok(d)
    }

    /// `1m to 7d`, as help texts state it.
    pub fn range(&self) -> String {
        format!("{} to {}", show(self.min), show(self.max))
    }
}

/// The same duration for date arithmetic; every range here fits.
pub fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// A duration in its largest whole unit: `7d`, `90s`, `1h`.
pub fn show(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % DAY == 0 => format!("{}d", s / DAY),
        s if s % HOUR == 0 => format!("{}h", s / HOUR),
        s if s % MINUTE == 0 => format!("{}m", s / MINUTE),
        s => format!("{s}s"),
    }
}

impl clap::builder::TypedValueParser for DurationIn {
    type Value = Duration;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &std::ffi::OsStr) -> Result<Duration, clap::Error> {
        let range = *self;
        // clap's own closure parser formats the error with the flag and value
        let parse = move |text: &str| range.check(text);
        parse.parse_ref(cmd, arg, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_grammar_users_already_write_still_parses() {
        let wide = secs(1, 36_500 * DAY, "test");
        for (text, seconds) in [("90s", 90), ("30m", 1800), ("2h30m", 9000), ("1h 30m", 5400), ("7d", 7 * DAY), ("2w", 14 * DAY), (" 1h ", HOUR)] {
            assert_eq!(wide.check(text).unwrap(), Duration::from_secs(seconds), "{text}");
        }
    }

    #[test]
    fn out_of_range_and_garbage_name_the_value_and_the_range() {
        let err = PAUSE_TTL.check("30s").unwrap_err();
        assert!(err.contains("`30s` is too short") && err.contains("1m to 7d"), "{err}");
        let err = PAUSE_TTL.check("8d").unwrap_err();
        assert!(err.contains("at most 7d"), "{err}");
        for bad in ["", "30", "m", "-5m", "1.5x", "30x", "ten minutes"] {
            let err = PAUSE_TTL.check(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}`")) && err.contains("1m to 7d"), "{bad}: {err}");
        }
    }

    #[test]
    fn huge_durations_are_refused_not_overflowed() {
        for huge in ["99999999999999999999s", "18446744073709551615d", "213503982334601d", "367d", "9000000000000000000h1s"] {
            let err = PAUSE_FOR.check(huge).unwrap_err();
            assert!(err.contains(huge) && err.contains("too long"), "{err}");
        }
        assert_eq!(PAUSE_FOR.check("366d").unwrap(), Duration::from_secs(366 * DAY));
        assert!(PAUSE_FOR.check("0s").unwrap_err().contains("too short"));
    }

    #[test]
    fn retention_ages_in_weeks_days_and_hours() {
        assert_eq!(RETENTION_AGE.check("30d").unwrap(), Duration::from_secs(30 * DAY));
        assert_eq!(RETENTION_AGE.check("2w").unwrap(), Duration::from_secs(14 * DAY));
        assert_eq!(RETENTION_AGE.check("12h").unwrap(), Duration::from_secs(12 * HOUR));
        for bad in ["9223372036854775807d", "9223372036854775807w", "153722867280912931m", "36501d", "0d", "30m"] {
            assert!(RETENTION_AGE.check(bad).is_err(), "{bad}");
        }
        assert_eq!(to_chrono(RETENTION_AGE.max), chrono::Duration::days(36_500));
    }

    #[test]
    fn show_uses_the_largest_whole_unit() {
        assert_eq!(show(Duration::from_secs(7 * DAY)), "7d");
        assert_eq!(show(Duration::from_secs(90)), "90s");
        assert_eq!(show(Duration::from_secs(HOUR)), "1h");
        assert_eq!(show(Duration::from_secs(10 * MINUTE)), "10m");
    }

    proptest! {
        #[test]
        fn no_text_panics_and_what_passes_is_in_range(text in ".{0,40}") {
            for range in [PAUSE_TTL, WAIT, OPERATOR_ACK, RETENTION_AGE] {
                if let Ok(d) = range.check(&text) {
                    prop_assert!(d >= range.min && d <= range.max);
                }
            }
        }

        #[test]
        fn numbers_with_units_never_panic(n in any::<u64>(), unit in prop::sample::select(vec!["s", "m", "h", "d", "w", "ms", "y", "M"])) {
            let _ = RETENTION_AGE.check(&format!("{n}{unit}"));
        }
    }
}
