//! A small `strftime` for the `strftime_now` template global (Llama-3-style templates print
//! today's date). Time is UTC; the proleptic Gregorian calendar conversion is Howard Hinnant's
//! `civil_from_days`. Supported: `%Y %y %m %d %e %H %I %M %S %p %j %a %A %b %B %h %F %T %D %%`.
//! Any other directive is an error naming it (a template printing garbage dates silently would
//! be worse).

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

/// `(year, month 1..=12, day 1..=31)` of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Formats `secs` since the Unix epoch (UTC).
pub fn format_utc(secs: i64, fmt: &str) -> Result<String, String> {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, sod % 3600 / 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[m as usize - 1] + d + u32::from(m > 2 && is_leap(y));
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            return Err("strftime_now: format ends with a lone %".into());
        };
        let piece = match spec {
            'Y' => y.to_string(),
            'y' => format!("{:02}", y.rem_euclid(100)),
            'm' => format!("{m:02}"),
            'd' => format!("{d:02}"),
            'e' => format!("{d:>2}"),
            'H' => format!("{hh:02}"),
            'I' => format!("{h12:02}"),
            'M' => format!("{mm:02}"),
            'S' => format!("{ss:02}"),
            'p' => (if hh < 12 { "AM" } else { "PM" }).to_string(),
            'j' => format!("{yday:03}"),
            'a' => DAYS[weekday][..3].to_string(),
            'A' => DAYS[weekday].to_string(),
            'b' | 'h' => MONTHS[m as usize - 1][..3].to_string(),
            'B' => MONTHS[m as usize - 1].to_string(),
            'F' => format!("{y}-{m:02}-{d:02}"),
            'T' => format!("{hh:02}:{mm:02}:{ss:02}"),
            'D' => format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            '%' => "%".to_string(),
            other => return Err(format!("strftime_now: unsupported directive %{other}")),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::format_utc;

    #[test]
    fn known_dates() {
        // date -u -d @0 / @951782400 (2000-02-29, leap day) / @1735689599 (2024-12-31 23:59:59)
        assert_eq!(
            format_utc(0, "%Y-%m-%d %H:%M:%S %a %j").unwrap(),
            "1970-01-01 00:00:00 Thu 001"
        );
        assert_eq!(
            format_utc(951_782_400, "%d %b %Y %A %j").unwrap(),
            "29 Feb 2000 Tuesday 060"
        );
        assert_eq!(
            format_utc(1_735_689_599, "%F %T %I%p %B %y").unwrap(),
            "2024-12-31 23:59:59 11PM December 24"
        );
    }

    #[test]
    fn unknown_directive_is_an_error() {
        assert!(format_utc(0, "%Q").unwrap_err().contains("%Q"));
        assert!(format_utc(0, "50%").is_err());
    }
}
