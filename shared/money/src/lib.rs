//! Money, exactly, over every value the schema can hold (principle 11).
//!
//! Every amount column is `DECIMAL(36,18)`: up to 18 digits before the point and 18 after,
//! 36 significant digits — more than `rust_decimal`'s 28, so it cannot hold
//! `999999999999999999.999999999999999999` and would refuse (or, decoded by sqlx, silently
//! round) such a value. [`Amount`] is the column's own representation: a count of
//! 10^-18 units in an `i128` (10^36 < 2^127), so every stored value round-trips exactly and
//! sums are exact integer additions, checked against the column's range.
//!
//! Text is the only way in and out: a plain decimal (`"-12.5"`, never `1e3`, never a float),
//! normalised on the way out (no trailing zeros). MySQL sends and takes `DECIMAL` as text, so
//! [`Amount`] binds and decodes directly; JSON carries it as a string.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Digits after the decimal point (the columns' scale).
pub const SCALE: usize = 18;
/// Digits before the decimal point (precision 36 − scale 18).
pub const INTEGER_DIGITS: usize = 18;
const UNITS_PER_ONE: i128 = 1_000_000_000_000_000_000;
/// 10^36 − 1 units: `999999999999999999.999999999999999999`.
const MAX_UNITS: i128 = UNITS_PER_ONE * UNITS_PER_ONE - 1;

/// An exact amount that fits `DECIMAL(36,18)`.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i128);

/// Why a text is not an amount (each message says what a client must fix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("{0:?} is not a plain decimal number like \"100.25\"")]
    NotDecimal(String),
    #[error("{0:?} has more than 18 decimal places")]
    TooManyDecimals(String),
    #[error("{0:?} has more than 18 digits before the decimal point")]
    TooLarge(String),
}

impl Amount {
    pub const ZERO: Amount = Amount(0);
    /// The largest amount a column holds.
    pub const MAX: Amount = Amount(MAX_UNITS);
    /// The smallest (most negative) amount a column holds.
    pub const MIN: Amount = Amount(-MAX_UNITS);
    /// 10^-18, the smallest positive amount.
    pub const SMALLEST: Amount = Amount(1);

    /// Parses a plain decimal: an optional `-`, digits, optionally `.` and digits. At most 18
    /// digits on each side (leading zeros and trailing fraction zeros do not count).
    pub fn parse(text: &str) -> Result<Self, AmountError> {
        let not_decimal = || AmountError::NotDecimal(text.to_owned());
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (integer, fraction) = match digits.split_once('.') {
            Some((i, f)) => (i, f),
            None => (digits, ""),
        };
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if integer.is_empty()
            || !all_digits(integer)
            || !all_digits(fraction)
            || (digits.contains('.') && fraction.is_empty())
        {
            return Err(not_decimal());
        }
        let fraction = fraction.trim_end_matches('0');
        if fraction.len() > SCALE {
            return Err(AmountError::TooManyDecimals(text.to_owned()));
        }
        let integer = integer.trim_start_matches('0');
        if integer.len() > INTEGER_DIGITS {
            return Err(AmountError::TooLarge(text.to_owned()));
        }
        // At most 18 + 18 digits: fits an i128 with room to spare.
        let mut units: i128 = 0;
        for b in integer.bytes() {
            units = units * 10 + i128::from(b - b'0');
        }
        for position in 0..SCALE {
            let digit = fraction.as_bytes().get(position).map_or(0, |b| b - b'0');
            units = units * 10 + i128::from(digit);
        }
        Ok(Amount(if negative { -units } else { units }))
    }

    /// An amount of `units` × 10^-18; `None` beyond the column's range.
    pub fn from_units(units: i128) -> Option<Self> {
        (-MAX_UNITS..=MAX_UNITS)
            .contains(&units)
            .then_some(Amount(units))
    }

    /// Whole units, e.g. `Amount::whole(100)` is `100`.
    pub fn whole(value: i64) -> Self {
        Amount(i128::from(value) * UNITS_PER_ONE)
    }

    pub fn units(self) -> i128 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub fn is_positive(self) -> bool {
        self.0 > 0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The sum, or `None` when it would not fit the column.
    pub fn checked_add(self, other: Amount) -> Option<Amount> {
        Amount::from_units(self.0 + other.0)
    }

    /// The difference, or `None` when it would not fit the column.
    pub fn checked_sub(self, other: Amount) -> Option<Amount> {
        Amount::from_units(self.0 - other.0)
    }

    /// Always fits: the range is symmetric.
    #[must_use]
    pub fn negated(self) -> Amount {
        Amount(-self.0)
    }

    /// `self` × `factor`, or `None` when it would not fit the column.
    pub fn checked_mul(self, factor: i64) -> Option<Amount> {
        self.0
            .checked_mul(i128::from(factor))
            .and_then(Amount::from_units)
    }
}

/// `+` and `-` are for amounts known to fit (tests, sums of column values): like integer
/// overflow, leaving the column's range is a bug and panics. Code that adds outside input
/// uses [`Amount::checked_add`] / [`Amount::checked_sub`].
impl std::ops::Add for Amount {
    type Output = Amount;

    fn add(self, other: Amount) -> Amount {
        match self.checked_add(other) {
            Some(sum) => sum,
            None => panic!("{self} + {other} is beyond DECIMAL(36,18)"),
        }
    }
}

impl std::ops::Sub for Amount {
    type Output = Amount;

    fn sub(self, other: Amount) -> Amount {
        match self.checked_sub(other) {
            Some(difference) => difference,
            None => panic!("{self} - {other} is beyond DECIMAL(36,18)"),
        }
    }
}

impl std::ops::Neg for Amount {
    type Output = Amount;

    fn neg(self) -> Amount {
        self.negated()
    }
}

impl std::iter::Sum for Amount {
    fn sum<I: Iterator<Item = Amount>>(amounts: I) -> Amount {
        amounts.fold(Amount::ZERO, |sum, amount| sum + amount)
    }
}

impl fmt::Display for Amount {
    /// Plain and normalised: `100`, `-0.5`, `999999999999999999.999999999999999999`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let magnitude = self.0.unsigned_abs();
        let per_one = UNITS_PER_ONE.unsigned_abs();
        let (integer, fraction) = (magnitude / per_one, magnitude % per_one);
        let sign = if self.0 < 0 { "-" } else { "" };
        if fraction == 0 {
            return write!(f, "{sign}{integer}");
        }
        let fraction = format!("{fraction:018}");
        write!(f, "{sign}{integer}.{}", fraction.trim_end_matches('0'))
    }
}

impl fmt::Debug for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Amount({self})")
    }
}

impl FromStr for Amount {
    type Err = AmountError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Amount::parse(text)
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Amount {
    /// From a JSON string only: a client that sent a number may already have lost digits to
    /// a float.
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

/// MySQL exchanges `DECIMAL` as text in both directions: an `Amount` binds as its exact
/// text and decodes from the column's text (`DECIMAL(36,18)` renders 18 decimals). The
/// parameter is declared `NEWDECIMAL`, so the server treats it as a decimal (a string
/// parameter would be compared as a double); sqlx has no public constructor for that type
/// info, so it is borrowed from sqlx's own `rust_decimal` support, which nothing else uses.
mod mysql {
    use sqlx::{
        Decode, Encode, MySql, Type,
        encode::IsNull,
        error::BoxDynError,
        mysql::{MySqlTypeInfo, MySqlValueRef},
    };

    use super::Amount;

    impl Type<MySql> for Amount {
        fn type_info() -> MySqlTypeInfo {
            <rust_decimal::Decimal as Type<MySql>>::type_info()
        }

        fn compatible(ty: &MySqlTypeInfo) -> bool {
            <rust_decimal::Decimal as Type<MySql>>::compatible(ty)
        }
    }

    impl Encode<'_, MySql> for Amount {
        fn encode_by_ref(&self, buf: &mut Vec<u8>) -> Result<IsNull, BoxDynError> {
            <&str as Encode<MySql>>::encode(self.to_string().as_str(), buf)
        }
    }

    impl Decode<'_, MySql> for Amount {
        fn decode(value: MySqlValueRef<'_>) -> Result<Self, BoxDynError> {
            Ok(Amount::parse(<&str as Decode<MySql>>::decode(value)?)?)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn a(text: &str) -> Amount {
        Amount::parse(text).unwrap()
    }

    #[test]
    fn the_whole_column_range_round_trips_exactly() {
        for text in [
            "999999999999999999.999999999999999999",
            "-999999999999999999.999999999999999999",
            "0.000000000000000001",
            "-0.000000000000000001",
            "123456789012345678.123456789012345678",
            "100",
            "0",
            "1000000000000000.5",
        ] {
            assert_eq!(a(text).to_string(), text);
        }
        assert_eq!(a("999999999999999999.999999999999999999"), Amount::MAX);
        assert_eq!(a("-999999999999999999.999999999999999999"), Amount::MIN);
        assert_eq!(a("0.000000000000000001"), Amount::SMALLEST);
    }

    #[test]
    fn stored_renderings_normalise() {
        assert_eq!(a("100.500000000000000000").to_string(), "100.5");
        assert_eq!(a("0.000000000000000000").to_string(), "0");
        assert_eq!(a("-0").to_string(), "0");
        assert_eq!(a("007.10").to_string(), "7.1");
        assert_eq!(a("1.0000000000000000000000").to_string(), "1");
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        for (text, expected) in [
            ("abc", AmountError::NotDecimal("abc".into())),
            ("", AmountError::NotDecimal(String::new())),
            ("1e5", AmountError::NotDecimal("1e5".into())),
            ("+1", AmountError::NotDecimal("+1".into())),
            (" 1", AmountError::NotDecimal(" 1".into())),
            ("1.", AmountError::NotDecimal("1.".into())),
            (".5", AmountError::NotDecimal(".5".into())),
            ("--1", AmountError::NotDecimal("--1".into())),
            ("1.2.3", AmountError::NotDecimal("1.2.3".into())),
            (
                "0.0000000000000000001",
                AmountError::TooManyDecimals("0.0000000000000000001".into()),
            ),
            (
                "1000000000000000000",
                AmountError::TooLarge("1000000000000000000".into()),
            ),
        ] {
            assert_eq!(Amount::parse(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn arithmetic_is_exact_and_checked_against_the_column() {
        assert_eq!(a("0.1").checked_add(a("0.2")).unwrap().to_string(), "0.3");
        assert_eq!(
            a("999999999999999999.999999999999999998").checked_add(Amount::SMALLEST),
            Some(Amount::MAX)
        );
        assert_eq!(Amount::MAX.checked_add(Amount::SMALLEST), None);
        assert_eq!(Amount::MIN.checked_sub(Amount::SMALLEST), None);
        assert_eq!(Amount::MAX.negated(), Amount::MIN);
        assert_eq!(Amount::whole(-100).to_string(), "-100");
        assert!(a("-1") < Amount::ZERO && Amount::ZERO < Amount::SMALLEST);
    }

    #[test]
    fn json_carries_amounts_as_strings_only() {
        let max: Amount =
            serde_json::from_str("\"999999999999999999.999999999999999999\"").unwrap();
        assert_eq!(max, Amount::MAX);
        assert_eq!(
            serde_json::to_string(&max).unwrap(),
            "\"999999999999999999.999999999999999999\""
        );
        let error = serde_json::from_str::<Amount>("100.5").unwrap_err();
        assert!(error.to_string().contains("as a string"), "{error}");
    }
}
