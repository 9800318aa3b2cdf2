//! What a posting is and what it can come to: [`Posting`], [`Posted`], [`LedgerError`]. One
//! function writes them, [`post_all`](super::post_all) (`record.rs`), whatever the number of
//! entries.

use paybus_money::Amount;

use super::{
    entry::{EntryType, ReferenceType},
    idem_key::IdemKey,
};

/// One entry to post. `amount` is positive; the [`EntryType`] gives the direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posting {
    pub partner_id: u64,
    /// An upper-case currency code such as `USDT` (see [`LedgerError::InvalidCurrency`]).
    pub currency: String,
    pub entry_type: EntryType,
    pub amount: Amount,
    pub reference_type: ReferenceType,
    pub reference_id: u64,
    /// `Some` only on the three once-only paths; see [`IdemKey`].
    pub idem_key: Option<IdemKey>,
    pub memo: Option<String>,
}

impl Posting {
    /// An un-keyed posting without a memo; add them with [`Posting::idem_key`] and
    /// [`Posting::memo`].
    pub fn new(
        partner_id: u64,
        currency: impl Into<String>,
        entry_type: EntryType,
        amount: Amount,
        reference_type: ReferenceType,
        reference_id: u64,
    ) -> Self {
        Self {
            partner_id,
            currency: currency.into(),
            entry_type,
            amount,
            reference_type,
            reference_id,
            idem_key: None,
            memo: None,
        }
    }

    pub fn idem_key(mut self, key: IdemKey) -> Self {
        self.idem_key = Some(key);
        self
    }

    pub fn memo(mut self, memo: impl Into<String>) -> Self {
        self.memo = Some(memo.into());
        self
    }

    /// Everything that can be checked without the database.
    pub(crate) fn validate(&self) -> Result<(), LedgerError> {
        if !self.amount.is_positive() {
            return Err(LedgerError::InvalidAmount {
                amount: self.amount,
                reason: "it must be greater than zero",
            });
        }
        let valid_code = (1..=16).contains(&self.currency.len())
            && self
                .currency
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        if !valid_code {
            return Err(LedgerError::InvalidCurrency {
                currency: self.currency.clone(),
            });
        }
        if let Some(key) = &self.idem_key
            && !key.fits(self.entry_type, self.reference_type, self.reference_id)
        {
            return Err(LedgerError::MisplacedIdemKey {
                idem_key: key.clone(),
                entry_type: self.entry_type,
                reference_type: self.reference_type,
                reference_id: self.reference_id,
            });
        }
        Ok(())
    }
}

/// The outcome of one posting of [`post_all`](super::post_all) (or [`post`](super::post)); both
/// are success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// This call wrote the entry (its `balance_after` is on the row) and moved the balance.
    /// The entry's id is not returned: no caller needs it, and for a batch it would cost a
    /// read of its own (a multi-row `INSERT … SELECT` reports only its first id).
    Recorded,
    /// An entry with this key already exists (written earlier, or by a concurrent transaction
    /// that committed first): nothing was written and the transaction is still usable.
    AlreadyRecorded { idem_key: IdemKey },
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger amount {amount} is not valid: {reason}")]
    InvalidAmount {
        amount: Amount,
        reason: &'static str,
    },
    #[error("{currency:?} is not a currency code (1 to 16 of A-Z, 0-9, '-', '_', '.')")]
    InvalidCurrency { currency: String },
    #[error(
        "idempotency key {idem_key} does not belong on a {entry_type} of {reference_type} {reference_id}"
    )]
    MisplacedIdemKey {
        idem_key: IdemKey,
        entry_type: EntryType,
        reference_type: ReferenceType,
        reference_id: u64,
    },
    #[error(
        "{entry_type} {amount} would take the balance of partner {partner_id} in {currency} \
         beyond what DECIMAL(36,18) holds"
    )]
    OutOfRange {
        partner_id: u64,
        currency: String,
        entry_type: EntryType,
        amount: Amount,
    },
    /// Fewer entries were written than posted (a gate row missing under its own lock): the
    /// caller rolls back.
    #[error("{written} ledger entries written for {expected} postings")]
    Incomplete { written: u64, expected: u64 },
    #[error("ledger database error: {0}")]
    Database(#[from] sqlx::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Amount {
        text.parse().unwrap()
    }

    #[test]
    fn credit_adds_and_debit_and_fee_subtract() {
        assert_eq!(EntryType::Credit.signed(d("2")), d("2"));
        assert_eq!(EntryType::Debit.signed(d("2")), d("-2"));
        assert_eq!(EntryType::Fee.signed(d("2")), d("-2"));
    }

    #[test]
    fn postings_are_validated_before_touching_the_database() {
        let ok = Posting::new(
            1,
            "USDT",
            EntryType::Debit,
            d("1"),
            ReferenceType::Withdrawal,
            7,
        );
        assert!(ok.validate().is_ok());
        assert!(
            ok.clone()
                .idem_key(IdemKey::withdrawal_confirm(7))
                .validate()
                .is_ok()
        );

        for amount in ["0", "-1", "-0.000000000000000001"] {
            let posting = Posting {
                amount: d(amount),
                ..ok.clone()
            };
            assert!(
                matches!(posting.validate(), Err(LedgerError::InvalidAmount { .. })),
                "{amount}"
            );
        }
        let extremes = [d("0.000000000000000001"), Amount::MAX];
        for amount in extremes {
            let posting = Posting {
                amount,
                ..ok.clone()
            };
            assert!(posting.validate().is_ok(), "{amount}");
        }

        for currency in ["", "usdt", "USDT ", "ABCDEFGHIJKLMNOPQ"] {
            let posting = Posting {
                currency: currency.to_owned(),
                ..ok.clone()
            };
            assert!(
                matches!(posting.validate(), Err(LedgerError::InvalidCurrency { .. })),
                "{currency:?}"
            );
        }

        let other_withdrawal = ok.clone().idem_key(IdemKey::withdrawal_confirm(8));
        let credit_with_debit_key = Posting {
            entry_type: EntryType::Credit,
            ..ok.clone().idem_key(IdemKey::withdrawal_confirm(7))
        };
        for posting in [other_withdrawal, credit_with_debit_key] {
            assert!(matches!(
                posting.validate(),
                Err(LedgerError::MisplacedIdemKey { .. })
            ));
        }
    }
}
