//! Money amounts in request bodies: a JSON *string* holding a plain decimal ("100.25"). A JSON
//! number is refused, because a client that sent one may already have lost digits to a float.
//! The value must fit the columns, `DECIMAL(36,18)`, exactly: no rounding ever happens here.

use std::fmt;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, de};

/// `DECIMAL(36,18)`: 18 digits on each side of the point.
const MAX_SCALE: usize = 18;
const MAX_INTEGER_DIGITS: usize = 18;

/// A non-negative amount that fits `DECIMAL(36,18)` exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amount(Decimal);

impl Amount {
    pub(crate) fn value(self) -> Decimal {
        self.0
    }

    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let (integer, fraction) = match text.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (text, None),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if text.starts_with('-') {
            return Err(format!("{text:?} is negative"));
        }
        if !digits(integer) || !fraction.is_none_or(digits) {
            return Err(format!(
                "{text:?} is not a plain decimal number like \"100.25\""
            ));
        }
        if fraction.is_some_and(|f| f.len() > MAX_SCALE) {
            return Err(format!("{text:?} has more than {MAX_SCALE} decimal places"));
        }
        if integer.trim_start_matches('0').len() > MAX_INTEGER_DIGITS {
            return Err(format!(
                "{text:?} has more than {MAX_INTEGER_DIGITS} digits before the decimal point"
            ));
        }
        Decimal::from_str_exact(text)
            .map(Amount)
            .map_err(|_| format!("{text:?} has more significant digits than can be kept exactly"))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Amount;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal amount as a string, e.g. \"100.25\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Amount, E> {
                Amount::parse(text).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// An amount as it leaves the API: a string without the column's trailing zeros.
pub(crate) fn to_text(value: Decimal) -> String {
    value.normalize().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_decimals_parse_exactly() {
        assert_eq!(Amount::parse("100").unwrap().to_string(), "100");
        assert_eq!(Amount::parse("0.1").unwrap().value(), Decimal::new(1, 1));
        let widest = "123456789012345678.1234567890";
        assert_eq!(Amount::parse(widest).unwrap().to_string(), widest);
        assert_eq!(
            Amount::parse("0.000000000000000001").unwrap().value(),
            Decimal::new(1, 18)
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        for (text, reason) in [
            ("abc", "plain decimal"),
            ("", "plain decimal"),
            ("1e5", "plain decimal"),
            ("1_000", "plain decimal"),
            (" 1", "plain decimal"),
            ("1.", "plain decimal"),
            (".5", "plain decimal"),
            ("-1", "negative"),
            ("0.0000000000000000001", "decimal places"),
            ("1234567890123456789", "digits before"),
            (
                "123456789012345678.123456789012345678",
                "significant digits",
            ),
        ] {
            let error = Amount::parse(text).unwrap_err();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_json_number_is_refused_saying_a_string_is_expected() {
        let error = serde_json::from_str::<Amount>("100.5").unwrap_err();
        assert!(error.to_string().contains("as a string"), "{error}");
        let ok: Amount = serde_json::from_str("\"100.5\"").unwrap();
        assert_eq!(ok.to_string(), "100.5");
    }

    #[test]
    fn output_drops_the_column_scale() {
        let stored = Decimal::from_str_exact("100.000000000000000000").unwrap();
        assert_eq!(to_text(stored), "100");
        assert_eq!(to_text(Decimal::new(2550, 2)), "25.5");
    }
}
