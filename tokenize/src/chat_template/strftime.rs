//! `strftime_now(format)`, the clock Hugging Face exposes to templates (Llama 3.x prints today's
//! date into its system prompt with `strftime_now("%d %b %Y")`). UTC, C locale, the directives
//! templates use; anything else is copied through as glibc does.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `datetime.now(UTC).strftime(format)`.
pub(crate) fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    format_utc(format, secs)
}

/// Civil date (year, month 1–12, day 1–31) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// `format` applied to the UTC time `secs` seconds after the Unix epoch.
pub(crate) fn format_utc(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod / 60 % 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday =
        cumulative[month as usize - 1] + i64::from(day) + i64::from(month > 2 && is_leap(year));

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `-` flag: no padding.
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |out: &mut String, n: i64, width: usize| {
            if unpadded {
                out.push_str(&n.to_string());
            } else {
                out.push_str(&format!("{n:0width$}"));
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('d') => num(&mut out, i64::from(day), 2),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('m') => num(&mut out, i64::from(month), 2),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('Y') => out.push_str(&year.to_string()),
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, (hour + 11) % 12 + 1, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('S') => num(&mut out, second, 2),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('j') => num(&mut out, yday, 3),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('T') => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::format_utc;

    #[test]
    fn formats_the_directives_templates_use() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let t = 1_722_000_309;
        assert_eq!(format_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            format_utc("%A %B %-d %y %H:%M:%S %I%p %j %%", t),
            "Friday July 26 24 13:25:09 01PM 208 %"
        );
        assert_eq!(format_utc("%F %T %Q", 0), "1970-01-01 00:00:00 %Q");
        // Leap day, and a day before the epoch.
        assert_eq!(
            format_utc("%Y-%m-%d %a %j", 951_782_400),
            "2000-02-29 Tue 060"
        );
        assert_eq!(format_utc("%Y-%m-%d %a", -86_400), "1969-12-31 Wed");
    }
}
