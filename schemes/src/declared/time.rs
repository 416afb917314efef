//! Signed timestamps as the providers write them.

/// How a provider writes a signed timestamp (`timestamp.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// Unix seconds (`unix`).
    Unix,
    /// Unix milliseconds (`unix_ms`).
    UnixMs,
    /// RFC 3339 (`rfc3339`).
    Rfc3339,
}

/// Unix seconds from a timestamp's text.
pub fn parse_time(text: &str, format: TimeFormat) -> Option<i64> {
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() && s.len() <= 18;
    match format {
        TimeFormat::Unix => digits(text).then(|| text.parse().ok()).flatten(),
        TimeFormat::UnixMs => digits(text).then(|| text.parse::<i64>().ok().map(|ms| ms / 1000)).flatten(),
        TimeFormat::Rfc3339 => rfc3339(text),
    }
}

/// A timestamp's text, as a provider writes `secs` (Unix seconds) in `format`:
/// what [`parse_time`] reads back (RFC 3339 in UTC, to the second).
pub fn format_time(secs: i64, format: TimeFormat) -> String {
    match format {
        TimeFormat::Unix => secs.to_string(),
        TimeFormat::UnixMs => (secs * 1000).to_string(),
        TimeFormat::Rfc3339 => {
            // A civil date from days (Howard Hinnant's algorithm, the inverse of `rfc3339`'s).
            let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
            let z = days + 719_468;
            let era = z.div_euclid(146_097);
            let doe = z - era * 146_097;
            let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
            let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
            let mp = (5 * doy + 2) / 153;
            let (day, month) = (doy - (153 * mp + 2) / 5 + 1, if mp < 10 { mp + 3 } else { mp - 9 });
            let year = yoe + era * 400 + i64::from(month <= 2);
            format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
        }
    }
}

/// `2021-07-25T10:00:00Z`, `2023-01-01T00:00:00.123456789+01:00`: Unix seconds.
fn rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let (h, m) = (rest[1..3].parse::<i64>().ok()?, rest[4..6].parse::<i64>().ok()?);
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}
