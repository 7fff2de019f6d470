//! Schedules: what a user writes (`every 30m`, `0 9 * * 1-5`, `in 2h`,
//! `2026-12-24T18:00`), parsed once into a [`Schedule`], stored in a
//! canonical text form, and asked for the next occurrence.
//!
//! Everything here is pure: "now" is always passed in, so the scheduler
//! can be tested under an injected clock.
//!
//! Cron expressions are evaluated in the configured [`Zone`] by croner. A
//! local time skipped by a daylight-saving change runs at the first moment
//! after the gap; a local time that happens twice runs once. Intervals are
//! fixed lengths of real time and ignore the zone.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Local, NaiveDateTime, TimeZone, Utc};
use croner::Cron;

/// The shortest interval an `every` schedule may have.
pub const MIN_INTERVAL: Duration = Duration::from_secs(60);

/// The longest interval or delay accepted (a year).
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);

/// How far in the past a one-shot time may be when the job is created (a
/// clock a little behind, a slow typist) before it is refused.
pub const ONESHOT_GRACE: Duration = Duration::from_secs(120);

/// The time zone cron expressions and times without an offset are read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// The machine's local zone.
    Local,
    /// An IANA zone (`Europe/Berlin`), from the config.
    Named(chrono_tz::Tz),
}

impl Zone {
    /// From `cron.timezone`.
    pub fn from_config(config: &talaria_core::config::CronConfig) -> Result<Zone, String> {
        Ok(config.zone()?.map_or(Zone::Local, Zone::Named))
    }

    /// The wall-clock reading of `t` in this zone, for people.
    pub fn format(&self, t: DateTime<Utc>) -> String {
        match self {
            Zone::Local => t
                .with_timezone(&Local)
                .format("%Y-%m-%d %H:%M %Z")
                .to_string(),
            Zone::Named(tz) => t.with_timezone(tz).format("%Y-%m-%d %H:%M %Z").to_string(),
        }
    }

    /// A local time in this zone: the earlier reading when it happens
    /// twice, the first moment after the gap when it does not happen.
    fn resolve(&self, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
        fn pick<Tz: TimeZone>(tz: &Tz, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
            if let Some(t) = tz.from_local_datetime(&naive).earliest() {
                return Some(t.with_timezone(&Utc));
            }
            // In a gap: step forward a minute at a time until the clock
            // exists again (gaps are at most a few hours).
            (1..=24 * 60).find_map(|m| {
                tz.from_local_datetime(&(naive + chrono::Duration::minutes(m)))
                    .earliest()
                    .map(|t| t.with_timezone(&Utc))
            })
        }
        match self {
            Zone::Local => pick(&Local, naive),
            Zone::Named(tz) => pick(tz, naive),
        }
    }

    /// The first time strictly after `after` that `cron` matches, in this
    /// zone.
    fn next_match(&self, cron: &Cron, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Zone::Local => cron
                .find_next_occurrence(&after.with_timezone(&Local), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
            Zone::Named(tz) => cron
                .find_next_occurrence(&after.with_timezone(tz), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }
}

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Every fixed interval, the first one interval after creation.
    Every(Duration),
    /// A five-field cron expression (or `@daily` and friends), kept with
    /// its text.
    Cron {
        /// The parsed expression.
        cron: Box<Cron>,
        /// The expression as the user wrote it, for display.
        text: String,
    },
    /// Once, at this time.
    Once(DateTime<Utc>),
}

/// Why a schedule is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(String);

impl ScheduleError {
    fn new(message: impl Into<String>) -> ScheduleError {
        ScheduleError(message.into())
    }
}

/// What every error message ends with: the forms accepted.
const FORMS: &str = "expected `every 30m` (m, h or d), a five-field cron expression like \
`0 9 * * 1-5`, `in 2h` or `2h` (once, that long from now), or a time like `2026-12-24T18:00` \
(once)";

/// The five fields of a cron expression and their ranges.
const CRON_FIELDS: &str = "its five fields are minute (0-59), hour (0-23), day of the month \
(1-31), month (1-12 or jan-dec) and day of the week (0-7 or sun-sat; 0 and 7 are Sunday)";

/// One field of a cron expression: its name for people and its range.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    /// How the range is said (`0 to 59`, `0 to 7, where 0 and 7 are Sunday`).
    range: &'static str,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        range: "from 0 to 59",
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        range: "from 0 to 23",
    },
    Field {
        name: "day of the month",
        min: 1,
        max: 31,
        range: "from 1 to 31",
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        range: "from 1 to 12 (or jan to dec)",
    },
    Field {
        name: "day of the week",
        min: 0,
        max: 7,
        range: "from 0 to 7 (or sun to sat; 0 and 7 are Sunday)",
    },
];

/// Checks every number of a five-field expression against its field's
/// range, so that an hour of 25 is refused by name ("the hour field")
/// rather than by croner's "Number out of bounds".
fn check_fields(expression: &str) -> Result<(), ScheduleError> {
    for (value, field) in expression.split_whitespace().zip(FIELDS.iter()) {
        for item in value.split(',') {
            // `a-b/step`, `*/step`, `5#2` (the second Friday), `5L`.
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => (range, Some(step)),
                None => (item, None),
            };
            let range = range.split('#').next().unwrap_or_default();
            for bound in range.split('-') {
                let digits = bound.trim_end_matches(['L', 'l', 'W', 'w']);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                let n: u64 = digits.parse().unwrap_or(u64::MAX);
                if n < u64::from(field.min) || n > u64::from(field.max) {
                    return Err(ScheduleError::new(format!(
                        "`{expression}`: the {} field is {digits}, but it must be {}",
                        field.name, field.range
                    )));
                }
            }
            if let Some(step) = step
                && step.bytes().all(|b| b.is_ascii_digit())
            {
                let n: u64 = step.parse().unwrap_or(u64::MAX);
                if n == 0 || n > u64::from(field.max.max(1)) {
                    return Err(ScheduleError::new(format!(
                        "`{expression}`: the step `/{step}` of the {} field must be from 1 to {}",
                        field.name,
                        field.max.max(1)
                    )));
                }
            }
        }
    }
    Ok(())
}

impl Schedule {
    /// Parses what a user wrote. `now` and `zone` give meaning to relative
    /// delays and to times without an offset.
    pub fn parse(text: &str, now: DateTime<Utc>, zone: Zone) -> Result<Schedule, ScheduleError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ScheduleError::new(format!(
                "the schedule is empty: {FORMS}"
            )));
        }
        if text.len() > 200 {
            return Err(ScheduleError::new("the schedule is too long"));
        }
        let lower = text.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("every ") {
            let period = parse_duration(rest.trim())
                .ok_or_else(|| ScheduleError::new(format!("`{text}`: {FORMS}")))?;
            if period < MIN_INTERVAL {
                return Err(ScheduleError::new(
                    "the shortest interval is one minute (`every 1m`)",
                ));
            }
            return Ok(Schedule::Every(period));
        }
        let delay = lower.strip_prefix("in ").unwrap_or(&lower).trim();
        if let Some(delay) = parse_duration(delay) {
            let at = now
                + chrono::Duration::from_std(delay)
                    .map_err(|_| ScheduleError::new("that delay is too long"))?;
            return Ok(Schedule::Once(truncate_to_second(at)));
        }
        if looks_like_time(text) {
            return parse_time(text, zone).map(Schedule::Once);
        }
        let fields = text.split_whitespace().count();
        if fields == 5 || text.starts_with('@') {
            let normalised = text.split_whitespace().collect::<Vec<_>>().join(" ");
            if fields == 5 {
                check_fields(&normalised)?;
            }
            // croner's own words name its types ("CronPattern contains
            // illegal character"); the ranges were checked above, so what
            // is left is the form.
            let cron = Cron::from_str(&normalised).map_err(|e| {
                let what = match e {
                    croner::errors::CronError::IllegalCharacters(_) => {
                        "has something a cron field cannot hold (fields are written with digits, \
                         names, `*`, `,`, `-`, `/`, and `L`, `W`, `#` where they apply)"
                    }
                    _ => "is not a cron expression",
                };
                ScheduleError::new(format!("`{text}` {what}; {CRON_FIELDS}"))
            })?;
            return Ok(Schedule::Cron {
                cron: Box::new(cron),
                text: normalised,
            });
        }
        Err(ScheduleError::new(format!("`{text}`: {FORMS}")))
    }

    /// Reads back a schedule stored by [`Schedule::canonical`]. One-shots
    /// are stored as absolute times, so `now` does not change them.
    pub fn from_stored(text: &str) -> Result<Schedule, ScheduleError> {
        Schedule::parse(
            text,
            DateTime::<Utc>::UNIX_EPOCH,
            Zone::Named(chrono_tz::UTC),
        )
    }

    /// The form stored with the job: the interval in its largest whole
    /// unit, the cron expression with single spaces, or the one-shot time
    /// in UTC (so a stored `in 2h` does not move).
    pub fn canonical(&self) -> String {
        self.to_string()
    }

    /// Whether this schedule runs once only.
    pub fn is_once(&self) -> bool {
        matches!(self, Schedule::Once(_))
    }

    /// The first occurrence of a job created at `now`.
    pub fn first(&self, now: DateTime<Utc>, zone: Zone) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Every(period) => Some(now + chrono::Duration::from_std(*period).ok()?),
            Schedule::Cron { cron, .. } => zone.next_match(cron, now),
            Schedule::Once(at) => Some(*at),
        }
    }

    /// The occurrence after `scheduled`, skipping any that are already
    /// past at `now`: what follows a run, or a miss, of `scheduled`.
    /// Intervals keep their phase (`scheduled` plus whole periods).
    pub fn following(
        &self,
        scheduled: DateTime<Utc>,
        now: DateTime<Utc>,
        zone: Zone,
    ) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Every(period) => {
                let period = i64::try_from(period.as_secs()).ok()?.max(1);
                let behind = (now - scheduled).num_seconds().max(0);
                let steps = behind / period + 1;
                Some(scheduled + chrono::Duration::seconds(steps.checked_mul(period)?))
            }
            Schedule::Cron { cron, .. } => zone.next_match(cron, scheduled.max(now)),
            Schedule::Once(_) => None,
        }
    }

    /// How late an occurrence may start and still count as on time; later
    /// than this it is a misfire. Half the period, clamped to two minutes
    /// to two hours (a minutely job has two minutes, a daily one two
    /// hours); two minutes for a one-shot.
    pub fn grace(&self, scheduled: DateTime<Utc>, zone: Zone) -> Duration {
        const MIN: Duration = Duration::from_secs(120);
        const MAX: Duration = Duration::from_secs(2 * 3600);
        let period = match self {
            Schedule::Every(period) => *period,
            Schedule::Cron { cron, .. } => zone
                .next_match(cron, scheduled)
                .and_then(|next| (next - scheduled).to_std().ok())
                .unwrap_or(MAX),
            Schedule::Once(_) => return MIN,
        };
        (period / 2).clamp(MIN, MAX)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every(period) => {
                let secs = period.as_secs();
                if secs % 86_400 == 0 {
                    write!(f, "every {}d", secs / 86_400)
                } else if secs % 3600 == 0 {
                    write!(f, "every {}h", secs / 3600)
                } else {
                    write!(f, "every {}m", secs / 60)
                }
            }
            Schedule::Cron { text, .. } => f.write_str(text),
            Schedule::Once(at) => {
                f.write_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            }
        }
    }
}

/// `30m`, `30 min`, `2h`, `2 hours`, `1d`: a positive whole number of
/// minutes, hours or days, at most [`MAX_INTERVAL`]. Seconds are not a unit
/// a schedule needs.
fn parse_duration(text: &str) -> Option<Duration> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits_end);
    let n: u64 = number.parse().ok()?;
    let unit_secs = match unit.trim() {
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        _ => return None,
    };
    let secs = n.checked_mul(unit_secs)?;
    let d = Duration::from_secs(secs);
    (n > 0 && d <= MAX_INTERVAL).then_some(d)
}

/// A date first (`2026-`), or an ISO `T` between digits.
fn looks_like_time(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

fn parse_time(text: &str, zone: Zone) -> Result<DateTime<Utc>, ScheduleError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(truncate_to_second(t.with_timezone(&Utc)));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(naive) = NaiveDateTime::parse_from_str(text, format) {
            return zone.resolve(naive).map(truncate_to_second).ok_or_else(|| {
                ScheduleError::new(format!("`{text}` does not exist in the time zone"))
            });
        }
    }
    Err(ScheduleError::new(format!(
        "`{text}` is not a time: write it as 2026-12-24T18:00 (in the configured time zone) or with an offset, 2026-12-24T18:00+01:00"
    )))
}

fn truncate_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn berlin() -> Zone {
        Zone::Named(chrono_tz::Europe::Berlin)
    }

    #[test]
    fn every_form_parses_and_prints_canonically() {
        let now = utc(2026, 12, 4, 12, 0);
        let z = berlin();
        let p = |s: &str| Schedule::parse(s, now, z).unwrap().canonical();
        assert_eq!(p("every 30m"), "every 30m");
        assert_eq!(p("Every 90 minutes"), "every 90m");
        assert_eq!(p("every 120m"), "every 2h");
        assert_eq!(p("every 2 days"), "every 2d");
        assert_eq!(p("0  9 * * 1-5"), "0 9 * * 1-5");
        assert_eq!(p("@daily"), "@daily");
        assert_eq!(p("in 2h"), "2026-12-04T14:00:00Z");
        assert_eq!(p("45m"), "2026-12-04T12:45:00Z");
        // Naive times are in the configured zone (Berlin is UTC+1 in winter).
        assert_eq!(p("2026-12-24T18:00"), "2026-12-24T17:00:00Z");
        assert_eq!(p("2026-12-24 18:00"), "2026-12-24T17:00:00Z");
        assert_eq!(p("2026-12-24T18:00:00-05:00"), "2026-12-24T23:00:00Z");
        // The stored forms read back to themselves, whatever "now" is.
        for s in [
            "every 30m",
            "0 9 * * 1-5",
            "2026-12-24T17:00:00Z",
            "every 2d",
        ] {
            assert_eq!(Schedule::from_stored(s).unwrap().canonical(), s);
        }
    }

    #[test]
    fn nonsense_is_refused_with_the_forms_accepted() {
        let now = utc(2026, 12, 4, 12, 0);
        for bad in [
            "",
            "every",
            "every 0m",
            "every 30s",
            "every 5x",
            "tomorrow",
            "* * *",
            "99 * * * *",
            "in -5m",
            "2026-13-45T10:00",
            "every 9999d",
        ] {
            let e = Schedule::parse(bad, now, berlin()).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad:?}");
        }
        let e = Schedule::parse("every 30s", now, berlin()).unwrap_err();
        assert!(e.to_string().contains("expected `every 30m`"), "{e}");
        let e = Schedule::parse("every 0m", now, berlin()).unwrap_err();
        assert!(e.to_string().contains("expected"), "{e}");
    }

    #[test]
    fn a_number_out_of_range_names_its_field_and_the_range() {
        let now = utc(2026, 12, 4, 12, 0);
        let said = |text: &str| {
            Schedule::parse(text, now, berlin())
                .unwrap_err()
                .to_string()
        };
        let e = said("0 25 * * *");
        assert!(
            e.contains("hour field is 25") && e.contains("0 to 23"),
            "{e}"
        );
        let e = said("61 * * * *");
        assert!(
            e.contains("minute field is 61") && e.contains("0 to 59"),
            "{e}"
        );
        let e = said("0 9 0 * *");
        assert!(e.contains("day of the month field is 0"), "{e}");
        let e = said("0 9 * 13 *");
        assert!(
            e.contains("month field is 13") && e.contains("1 to 12"),
            "{e}"
        );
        let e = said("0 9 * * 1-9");
        assert!(e.contains("day of the week field is 9"), "{e}");
        let e = said("*/0 * * * *");
        assert!(e.contains("step `/0` of the minute field"), "{e}");
        for good in [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "0 0 L * *",
            "0 9 * * 5#2",
            "0 9 * jan mon-fri",
            "0 0 * * 7",
        ] {
            assert!(Schedule::parse(good, now, berlin()).is_ok(), "{good}");
        }
    }

    #[test]
    fn intervals_keep_their_phase_and_skip_what_is_past() {
        let s = Schedule::Every(Duration::from_secs(1800));
        let z = berlin();
        let created = utc(2026, 12, 4, 12, 0);
        assert_eq!(s.first(created, z), Some(utc(2026, 12, 4, 12, 30)));
        let scheduled = utc(2026, 12, 4, 12, 30);
        // On time: the next slot.
        assert_eq!(
            s.following(scheduled, scheduled, z),
            Some(utc(2026, 12, 4, 13, 0))
        );
        // Three hours of downtime: the next slot after now, same phase.
        assert_eq!(
            s.following(scheduled, utc(2026, 12, 4, 15, 40), z),
            Some(utc(2026, 12, 4, 16, 0))
        );
        // Exactly on a slot boundary, that slot is past.
        assert_eq!(
            s.following(scheduled, utc(2026, 12, 4, 16, 0), z),
            Some(utc(2026, 12, 4, 16, 30))
        );
    }

    #[test]
    fn cron_expressions_are_read_in_the_configured_zone() {
        let now = utc(2026, 12, 4, 12, 0);
        let s = Schedule::parse("0 9 * * *", now, berlin()).unwrap();
        // 09:00 in Berlin is 08:00 UTC in winter; today's has passed.
        assert_eq!(s.first(now, berlin()), Some(utc(2026, 12, 5, 8, 0)));
        let tokyo = Zone::Named(chrono_tz::Asia::Tokyo);
        assert_eq!(s.first(now, tokyo), Some(utc(2026, 12, 5, 0, 0)));
        let utc_zone = Zone::Named(chrono_tz::UTC);
        assert_eq!(s.first(now, utc_zone), Some(utc(2026, 12, 5, 9, 0)));
        // In summer Berlin is UTC+2.
        let july = utc(2026, 7, 1, 12, 0);
        assert_eq!(s.first(july, berlin()), Some(utc(2026, 7, 2, 7, 0)));
    }

    #[test]
    fn a_time_skipped_by_the_spring_change_runs_once_after_the_gap() {
        // Berlin, 2026-03-29: 02:00 jumps to 03:00, so 02:30 never happens.
        let s = Schedule::parse("30 2 * * *", utc(2026, 3, 27, 12, 0), berlin()).unwrap();
        let z = berlin();
        let before = utc(2026, 3, 28, 12, 0);
        let first = s.first(before, z).unwrap();
        // It runs on the day of the change, once, just after the gap...
        assert_eq!(
            first
                .with_timezone(&chrono_tz::Europe::Berlin)
                .date_naive()
                .to_string(),
            "2026-03-29"
        );
        assert!(first >= utc(2026, 3, 29, 1, 0), "{first}");
        assert!(first <= utc(2026, 3, 29, 1, 30), "{first}");
        // ...and the day after at 02:30 summer time (00:30 UTC).
        let second = s.following(first, first, z).unwrap();
        assert_eq!(second, utc(2026, 3, 30, 0, 30));
    }

    #[test]
    fn a_time_that_happens_twice_in_the_autumn_runs_once() {
        // Berlin, 2026-10-25: 03:00 falls back to 02:00, so 02:30 happens
        // twice (00:30 and 01:30 UTC).
        let z = berlin();
        let s = Schedule::parse("30 2 * * *", utc(2026, 10, 23, 12, 0), z).unwrap();
        let mut runs = Vec::new();
        let mut t = s.first(utc(2026, 10, 24, 12, 0), z).unwrap();
        while t < utc(2026, 10, 27, 0, 0) {
            runs.push(t);
            t = s.following(t, t, z).unwrap();
        }
        let on_the_day: Vec<_> = runs
            .iter()
            .filter(|r| {
                r.with_timezone(&chrono_tz::Europe::Berlin)
                    .date_naive()
                    .to_string()
                    == "2026-10-25"
            })
            .collect();
        assert_eq!(on_the_day.len(), 1, "{runs:?}");
        assert_eq!(runs.len(), 2, "{runs:?}");
    }

    #[test]
    fn an_hourly_job_across_the_spring_change_loses_only_the_missing_hour() {
        let z = berlin();
        let s = Schedule::parse("0 * * * *", utc(2026, 3, 28, 0, 0), z).unwrap();
        let mut t = s.first(utc(2026, 3, 28, 23, 30), z).unwrap();
        let mut runs = Vec::new();
        while t < utc(2026, 3, 29, 4, 0) {
            runs.push(t);
            t = s.following(t, t, z).unwrap();
        }
        // Real hours 00:00..03:00 UTC: one run per real hour, none twice.
        let mut dedup = runs.clone();
        dedup.dedup();
        assert_eq!(dedup, runs);
        for pair in runs.windows(2) {
            assert!(pair[1] - pair[0] >= chrono::Duration::hours(1), "{runs:?}");
        }
    }

    #[test]
    fn grace_is_half_the_period_within_bounds() {
        let z = berlin();
        let now = utc(2026, 12, 4, 12, 0);
        let g = |s: &str| {
            Schedule::parse(s, now, z)
                .unwrap()
                .grace(utc(2026, 12, 4, 12, 0), z)
                .as_secs()
        };
        assert_eq!(g("every 1m"), 120);
        assert_eq!(g("every 30m"), 900);
        assert_eq!(g("every 1d"), 7200);
        assert_eq!(g("*/10 * * * *"), 300);
        assert_eq!(g("in 1h"), 120);
    }
}
