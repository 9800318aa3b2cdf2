//! Money amounts in request bodies: a JSON *string* holding a plain decimal ("100.25"). A JSON
//! number is refused, because a client that sent one may already have lost digits to a float.
//! The value must fit the columns, `DECIMAL(36,18)`, exactly — every value they hold is
//! accepted ([`paybus_money::Amount`]) and nothing is ever rounded; amounts in requests are
//! never negative.

use std::fmt;

use paybus_money::Amount as Money;
use serde::{Deserialize, Deserializer, de};

/// A non-negative amount that fits `DECIMAL(36,18)` exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amount(Money);

impl Amount {
    pub(crate) fn value(self) -> Money {
        self.0
    }

    fn non_negative(money: Money) -> Result<Self, String> {
        if money.is_negative() {
            return Err(format!("\"{money}\" is negative"));
        }
        Ok(Amount(money))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// paybus-money's own parsing (a JSON string of a plain decimal that fits), then the one rule
/// requests add: not negative.
impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Amount::non_negative(Money::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

/// In the OpenAPI document: a string of at most 18 integer and 18 fractional digits.
impl utoipa::PartialSchema for Amount {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::String)
            .pattern(Some(r"^[0-9]{1,18}(\.[0-9]{1,18})?$"))
            .description(Some(
                "A non-negative decimal as a string (never a JSON number), DECIMAL(36,18)",
            ))
            .examples(["100.25"])
            .into()
    }
}

impl utoipa::ToSchema for Amount {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's amount field holding `text`.
    fn parse(text: &str) -> Result<Amount, String> {
        serde_json::from_value(serde_json::Value::String(text.to_owned()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn plain_decimals_parse_exactly_over_the_whole_column() {
        assert_eq!(parse("100").unwrap().to_string(), "100");
        assert_eq!(parse("0.1").unwrap().to_string(), "0.1");
        assert_eq!(
            parse("123456789012345678.1234567890").unwrap().to_string(),
            "123456789012345678.123456789"
        );
        for widest in [
            "999999999999999999.999999999999999999",
            "123456789012345678.123456789012345678",
        ] {
            assert_eq!(parse(widest).unwrap().to_string(), widest);
        }
        assert_eq!(
            parse("0.000000000000000001").unwrap().value(),
            Money::SMALLEST
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
        ] {
            let error = parse(text).unwrap_err();
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
}
