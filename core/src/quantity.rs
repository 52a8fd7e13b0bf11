//! Kubernetes resource quantities (`2Gi`, `512Mi`, `1.5Gi`, `100m`, `1e3`), parsed exactly.
//!
//! The value is kept as a whole number of nano-units in an `i128` (Kubernetes itself rounds
//! anything finer up to `1n`), so comparisons never touch a float. The original text (or
//! number) is kept and written back unchanged, so a manifest round-trips byte for byte.

use std::cmp::Ordering;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limits::QUANTITY_BYTES_MAX;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// How the quantity was written, so it can be written back exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Written {
    Text(String),
    Number(serde_json::Number),
}

/// A resource quantity: an exact value plus the way it was written.
#[derive(Debug, Clone)]
pub struct Quantity {
    nanos: i128,
    written: Written,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a quantity: {why}")]
pub struct QuantityError {
    /// The offending text (cut to [`QUANTITY_BYTES_MAX`]).
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Quantity {
    /// Parses Kubernetes quantity syntax: `<sign?><digits>[.<digits>]<suffix?>`, suffix one of
    /// `Ki Mi Gi Ti Pi Ei`, `n u m k M G T P E`, or an exponent `e3` / `E-2`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let nanos = parse_nanos(text)?;
        Ok(Quantity {
            nanos,
            written: Written::Text(text.to_owned()),
        })
    }

    /// A quantity of whole bytes (or units), written canonically (`4Gi`, `512Mi`, `1000`).
    pub fn from_units(units: i128) -> Self {
        let text = canonical_binary(units);
        Quantity {
            nanos: units.saturating_mul(NANOS_PER_UNIT),
            written: Written::Text(text),
        }
    }

    /// The exact value in nano-units (`1Gi` → 1073741824 × 10⁹).
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The value rounded up to whole units (bytes for memory, cores for CPU).
    pub fn units_ceil(&self) -> i128 {
        let q = self.nanos.div_euclid(NANOS_PER_UNIT);
        if self.nanos.rem_euclid(NANOS_PER_UNIT) == 0 {
            q
        } else {
            q + 1
        }
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// The text as written (numbers are rendered as JSON renders them).
    pub fn as_written(&self) -> String {
        match &self.written {
            Written::Text(t) => t.clone(),
            Written::Number(n) => n.to_string(),
        }
    }
}

impl PartialEq for Quantity {
    /// Two quantities are equal when their values are (`1Gi == 1024Mi`).
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_written())
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Renders whole units with the largest binary suffix that divides them exactly.
fn canonical_binary(units: i128) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if units != 0 {
        for (suffix, shift) in SUFFIXES {
            let unit = 1i128 << shift;
            if units % unit == 0 {
                return format!("{}{}", units / unit, suffix);
            }
        }
    }
    units.to_string()
}

fn err(text: &str, why: &'static str) -> QuantityError {
    let mut t: String = text.chars().take(QUANTITY_BYTES_MAX).collect();
    if t.len() < text.len() {
        t.push('…');
    }
    QuantityError { text: t, why }
}

fn parse_nanos(text: &str) -> Result<i128, QuantityError> {
    if text.is_empty() {
        return Err(err(text, "empty"));
    }
    if text.len() > QUANTITY_BYTES_MAX {
        return Err(err(text, "too long"));
    }
    let bytes = text.as_bytes();
    let mut i = 0;
    let negative = match bytes[0] {
        b'-' => {
            i = 1;
            true
        }
        b'+' => {
            i = 1;
            false
        }
        _ => false,
    };
    // Digits, with at most one decimal point.
    let mut mantissa: i128 = 0;
    let mut frac_digits: i32 = 0;
    let mut seen_point = false;
    let mut digits = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_digit() {
            digits += 1;
            if digits > 30 {
                return Err(err(text, "too many digits"));
            }
            mantissa = mantissa * 10 + i128::from(b - b'0');
            if seen_point {
                frac_digits += 1;
            }
        } else if b == b'.' && !seen_point {
            seen_point = true;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 {
        return Err(err(text, "no digits"));
    }
    let suffix = &text[i..];
    // value = mantissa × 10^(exp10 − frac_digits) × 2^shift
    let (exp10, shift): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| err(text, "bad exponent"))?;
            if !(-30..=30).contains(&exp) {
                return Err(err(text, "exponent out of range"));
            }
            (exp, 0)
        }
        _ => return Err(err(text, "unknown suffix")),
    };
    // In nanos: mantissa × 2^shift × 10^(exp10 − frac_digits + 9), rounded up like Kubernetes.
    let too_big = || err(text, "out of range");
    let mut value = mantissa.checked_mul(1i128 << shift).ok_or_else(too_big)?;
    let scale = exp10 - frac_digits + 9;
    if scale >= 0 {
        let factor = 10i128.checked_pow(scale as u32).ok_or_else(too_big)?;
        value = value.checked_mul(factor).ok_or_else(too_big)?;
    } else {
        let divisor = 10i128.checked_pow((-scale) as u32).ok_or_else(too_big)?;
        let q = value / divisor;
        value = if value % divisor == 0 { q } else { q + 1 };
    }
    // Keep a margin so sums and products of a few quantities cannot overflow.
    if value > i128::MAX / 1024 {
        return Err(too_big());
    }
    Ok(if negative { -value } else { value })
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.written {
            Written::Text(t) => s.serialize_str(t),
            Written::Number(n) => n.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as \"2Gi\", \"500m\" or 1")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Quantity::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity {
                    nanos: i128::from(v) * NANOS_PER_UNIT,
                    written: Written::Number(v.into()),
                })
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity {
                    nanos: i128::from(v) * NANOS_PER_UNIT,
                    written: Written::Number(v.into()),
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                let n = serde_json::Number::from_f64(v)
                    .ok_or_else(|| E::custom("a quantity must be a finite number"))?;
                // Parse the shortest decimal rendering, which is exact for what was written.
                let nanos = parse_nanos(&n.to_string()).map_err(E::custom)?;
                Ok(Quantity {
                    nanos,
                    written: Written::Number(n),
                })
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).expect(s)
    }

    #[test]
    fn binary_and_decimal_suffixes_are_exact() {
        assert_eq!(q("2Gi").units_ceil(), 2 * 1024 * 1024 * 1024);
        assert_eq!(q("1.5Gi").units_ceil(), 1536 * 1024 * 1024);
        assert_eq!(q("512Mi").units_ceil(), 512 * 1024 * 1024);
        assert_eq!(q("100m").nanos(), 100_000_000);
        assert_eq!(q("1e3").units_ceil(), 1000);
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert!(q("1G") < q("1Gi"));
        assert_eq!(q("0.5").to_string(), "0.5");
        assert_eq!(q("-1").nanos(), -NANOS_PER_UNIT);
    }

    #[test]
    fn finer_than_nano_rounds_up_like_kubernetes() {
        assert_eq!(q("0.1n").nanos(), 1);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "2Gx",
            "Gi",
            "1..5",
            "1e",
            "1e99",
            "--1",
            "1 Gi",
            "99999999999999999999999999999999Ei",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn canonical_rendering() {
        assert_eq!(Quantity::from_units(4 << 30).to_string(), "4Gi");
        assert_eq!(Quantity::from_units(1536 << 20).to_string(), "1536Mi");
        assert_eq!(Quantity::from_units(1000).to_string(), "1000");
    }

    #[test]
    fn numbers_round_trip_as_numbers() {
        let v: Quantity = serde_json::from_str("1").unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), "1");
        let v: Quantity = serde_json::from_str("1.5").unwrap();
        assert_eq!(v.nanos(), 1_500_000_000);
        assert_eq!(serde_json::to_string(&v).unwrap(), "1.5");
    }
}
