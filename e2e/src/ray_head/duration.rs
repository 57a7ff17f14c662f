//! `--deploy-delay` values such as `1s`, `250ms`, `2m`: a tiny parser, so the stand-in needs no
//! extra crate for one flag.

use std::time::Duration;

/// Parses `<integer><unit>` with unit `ms`, `s` or `m` (a bare `0` is also accepted).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("duration {text:?} has no unit (use e.g. 500ms, 1s, 2m)"))?;
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("duration {text:?} must start with a whole number"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("duration {text:?} is too large"))?,
        _ => {
            return Err(format!(
                "duration {text:?}: unknown unit {unit:?} (use ms, s or m)"
            ));
        }
    };
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_duration("1").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }
}
