//! Reading Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1G`, `1e3`) as whole numbers
//! of a unit, rounded up the way the scheduler rounds them (`MilliValue`, `Value`).
//!
//! Grammar (from `k8s.io/apimachinery/pkg/api/resource`):
//! `<sign>? <digits>[.<digits>] <suffix>`, where the suffix is a binary SI suffix
//! (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`m`, none, `k M G T P E`) or a decimal exponent
//! (`e<int>` / `E<int>`).
//!
//! Negative or malformed quantities give `None`: callers treat them as "cannot tell", which for
//! the target check means "does not fit".

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// `q` in thousandths of its unit, rounded up: CPU in millicores.
pub(crate) fn milli_value(q: &Quantity) -> Option<u128> {
    scaled(&q.0, 3)
}

/// `q` in whole units, rounded up: memory in bytes, a pod count.
pub(crate) fn value(q: &Quantity) -> Option<u128> {
    scaled(&q.0, 0)
}

/// Parses `s` and returns `ceil(s × 10^scale_exp)`, saturating at `u128::MAX`.
fn scaled(s: &str, scale_exp: i32) -> Option<u128> {
    let s = s.strip_prefix('+').unwrap_or(s);
    // Requests and capacities are never negative; "-0" is still zero.
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if frac_part.contains('.') {
        return None;
    }
    let (binary_pow, suffix_exp10) = parse_suffix(suffix)?;

    // mantissa × 10^exp10 is the number as written, without its suffix.
    let digits = int_part.bytes().chain(frac_part.bytes());
    let mut mantissa: u128 = 0;
    let mut exp10 = -i64::try_from(frac_part.len()).ok()?;
    let mut significant = 0usize;
    let mut dropped_nonzero = false;
    for d in digits {
        let d = u128::from(d - b'0');
        if mantissa == 0 && d == 0 {
            continue;
        }
        significant += 1;
        // 20 significant digits keep mantissa × 2^60 (the `Ei` factor) inside u128. Quantities
        // the API server stores are canonical and far shorter; beyond that we drop digits and
        // round the mantissa up, which stays a safe over-estimate.
        if significant > 20 {
            exp10 += 1;
            dropped_nonzero |= d != 0;
            continue;
        }
        mantissa = mantissa * 10 + d;
    }
    if dropped_nonzero {
        mantissa += 1;
    }
    if negative && mantissa != 0 {
        return None;
    }
    if mantissa == 0 {
        return Some(0);
    }

    let numerator = mantissa << (10 * binary_pow);
    let exp = exp10 + suffix_exp10 + i64::from(scale_exp);
    if exp >= 0 {
        let factor = u32::try_from(exp).ok().and_then(|e| 10u128.checked_pow(e));
        Some(
            factor
                .and_then(|f| numerator.checked_mul(f))
                .unwrap_or(u128::MAX),
        )
    } else {
        match u32::try_from(-exp).ok().and_then(|e| 10u128.checked_pow(e)) {
            Some(divisor) => Some(numerator.div_ceil(divisor)),
            // The divisor exceeds any numerator: a positive sliver rounds up to one unit.
            None => Some(1),
        }
    }
}

/// `(power of 1024, power of 10)` of a suffix.
fn parse_suffix(suffix: &str) -> Option<(u32, i64)> {
    let parsed = match suffix {
        "" => (0, 0),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        // A lone `E` is exa; `E` followed by an integer is an exponent.
        "E" => (0, 18),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Absurd exponents saturate rather than fail: 1e999999999999 is simply "huge".
            let exp = exponent
                .parse::<i64>()
                .unwrap_or(if exponent.starts_with('-') {
                    -1_000_000
                } else {
                    1_000_000
                });
            (0, exp.clamp(-1_000_000, 1_000_000))
        }
    };
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn cpu_in_millicores() {
        let cases: &[(&str, Option<u128>)] = &[
            ("100m", Some(100)),
            ("2", Some(2000)),
            ("0.5", Some(500)),
            (".5", Some(500)),
            ("1.", Some(1000)),
            ("+1", Some(1000)),
            ("1k", Some(1_000_000)),
            ("0.0001", Some(1)), // rounds up, like MilliValue
            ("1u", Some(1)),
            ("1500u", Some(2)),
            ("250000n", Some(1)),
            ("0", Some(0)),
            ("-0", Some(0)),
            ("000", Some(0)),
            ("1e3", Some(1_000_000)),
            ("1E3", Some(1_000_000)),
            ("1e-3", Some(1)),
            ("5e-4", Some(1)),
            ("1e-400", Some(1)),
            ("0e5", Some(0)),
            ("1e400", Some(u128::MAX)),
            ("1E", Some(1_000_000_000_000_000_000_000)),
            ("-1", None),
            ("-100m", None),
            ("", None),
            (".", None),
            ("m", None),
            ("1.2.3", None),
            ("1 m", None),
            ("1mi", None),
            ("1e", None),
            ("1e+", None),
            ("1e1.5", None),
            ("1KB", None),
            ("abc", None),
        ];
        for (input, want) in cases {
            assert_eq!(milli_value(&q(input)), *want, "milli_value({input:?})");
        }
    }

    #[test]
    fn memory_in_bytes() {
        let cases: &[(&str, Option<u128>)] = &[
            ("128Mi", Some(128 * 1024 * 1024)),
            ("1G", Some(1_000_000_000)),
            ("1e3", Some(1000)),
            ("1Ki", Some(1024)),
            ("0.5Ki", Some(512)),
            ("1.5Gi", Some(1_610_612_736)),
            ("1Ti", Some(1 << 40)),
            ("2Ei", Some(2 << 60)),
            ("1M", Some(1_000_000)),
            ("16Gi", Some(16 << 30)),
            ("1500m", Some(2)), // a fractional byte rounds up
            ("1m", Some(1)),
            ("123", Some(123)),
            (
                "100000000000000000000000",
                Some(100_000_000_000_000_000_000_000),
            ),
            ("99999999999999999999999999999999999999999", Some(u128::MAX)),
        ];
        for (input, want) in cases {
            assert_eq!(value(&q(input)), *want, "value({input:?})");
        }
    }

    #[test]
    fn very_long_mantissas_round_up_never_down() {
        // 1.000…0001 with 30 digits: dropping digits must not make it exactly 1.
        assert_eq!(value(&q("1.00000000000000000000000000001")), Some(2));
        assert_eq!(milli_value(&q("0.123456789012345678901234567")), Some(124));
    }
}
