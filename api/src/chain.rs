//! Chain identifiers (transaction hashes, addresses) and other short codes arriving from
//! outside: checked for shape, and `0x`-hex values lower-cased, because hex is
//! case-insensitive on chain while the `deposits` unique key compares bytes exactly (base58
//! and other encodings are case-sensitive and kept as sent).

use crate::ApiError;

/// A transaction hash or an address: 1..=`max_len` printable ASCII characters, no spaces.
pub(crate) fn identifier(field: &str, value: &str, max_len: usize) -> Result<String, ApiError> {
    if value.is_empty() {
        return Err(ApiError::BadRequest(format!("{field} must not be empty")));
    }
    if value.len() > max_len {
        return Err(ApiError::BadRequest(format!(
            "{field} is longer than {max_len} characters"
        )));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest(format!(
            "{field} must be printable ASCII without spaces"
        )));
    }
    let is_hex = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()));
    Ok(if is_hex {
        value.to_ascii_lowercase()
    } else {
        value.to_owned()
    })
}

/// A currency code such as `USDT`: 1..=16 ASCII letters, digits, `-` or `_`, upper-cased.
pub(crate) fn currency(value: &str) -> Result<String, ApiError> {
    let valid = !value.is_empty()
        && value.len() <= 16
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(value.to_ascii_uppercase())
    } else {
        Err(ApiError::BadRequest(
            "currency must be 1 to 16 letters, digits, '-' or '_' (e.g. \"USDT\")".to_owned(),
        ))
    }
}

/// A positive row id (0 is never an `AUTO_INCREMENT` value).
pub(crate) fn id(field: &str, value: u64) -> Result<u64, ApiError> {
    if value == 0 {
        Err(ApiError::BadRequest(format!(
            "{field} must be a positive integer"
        )))
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_identifiers_are_lower_cased_others_kept() {
        assert_eq!(identifier("tx_hash", "0xABcd01", 128).unwrap(), "0xabcd01");
        assert_eq!(
            identifier("to_address", "TQn9Y2khEsLJW1ChVWFMSMeRDow5KcbLSE", 255).unwrap(),
            "TQn9Y2khEsLJW1ChVWFMSMeRDow5KcbLSE"
        );
        // Not hex after the prefix: kept as sent.
        assert_eq!(identifier("tx_hash", "0xZZ", 128).unwrap(), "0xZZ");
    }

    #[test]
    fn empty_long_or_spaced_identifiers_are_refused() {
        assert!(identifier("tx_hash", "", 128).is_err());
        assert!(identifier("tx_hash", &"a".repeat(129), 128).is_err());
        assert!(identifier("tx_hash", &"a".repeat(128), 128).is_ok());
        assert!(identifier("tx_hash", "0xab cd", 128).is_err());
        assert!(identifier("tx_hash", "0xab\n", 128).is_err());
    }

    #[test]
    fn currencies_are_codes() {
        assert_eq!(currency("usdt").unwrap(), "USDT");
        assert!(currency("").is_err());
        assert!(currency("US DT").is_err());
        assert!(currency(&"A".repeat(17)).is_err());
    }
}
