//! Idempotency keys of ledger entries (seed 001 §3, DDL v2.22).

use std::fmt;

use super::entry::{EntryType, ReferenceType};

/// The key of a ledger entry that must exist at most once (`ledger_entries.idem_key`, unique).
///
/// There are exactly three constructors, one per path where "one reference, one entry" is
/// guaranteed by the code that posts it:
///
/// | constructor | key | entry |
/// | --- | --- | --- |
/// | [`IdemKey::withdrawal_confirm`] | `WDR_CONFIRM:{withdrawal id}` | DEBIT of a NORMAL withdrawal's confirmation |
/// | [`IdemKey::deposit_credit`] | `DEP_CREDIT:{deposit id}` | CREDIT of a deposit's confirmation |
/// | [`IdemKey::deposit_fee`] | `DEP_FEE:{deposit id}` | FEE of a deposit's confirmation |
///
/// Every other posting passes `None`: P2P legs and safety-net corrections legitimately write
/// several DEBITs for one withdrawal, a P2P settlement writes CREDIT and FEE for one match, and
/// MIGRATION / settlement inflows repeat too. A key there would swallow real money movements
/// as "already recorded" (seed 001 §3: never key the P2P paths). Deliberately there is no way
/// to build a key from an arbitrary string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdemKey {
    text: String,
    entry_type: EntryType,
    reference_type: ReferenceType,
    reference_id: u64,
}

impl IdemKey {
    /// `WDR_CONFIRM:{withdrawal_id}`: the DEBIT written when a NORMAL withdrawal is confirmed.
    pub fn withdrawal_confirm(withdrawal_id: u64) -> Self {
        Self::new(
            "WDR_CONFIRM",
            EntryType::Debit,
            ReferenceType::Withdrawal,
            withdrawal_id,
        )
    }

    /// `DEP_CREDIT:{deposit_id}`: the CREDIT written when a deposit is confirmed.
    pub fn deposit_credit(deposit_id: u64) -> Self {
        Self::new(
            "DEP_CREDIT",
            EntryType::Credit,
            ReferenceType::Deposit,
            deposit_id,
        )
    }

    /// `DEP_FEE:{deposit_id}`: the FEE written when a deposit with a fee is confirmed.
    pub fn deposit_fee(deposit_id: u64) -> Self {
        Self::new(
            "DEP_FEE",
            EntryType::Fee,
            ReferenceType::Deposit,
            deposit_id,
        )
    }

    fn new(
        prefix: &str,
        entry_type: EntryType,
        reference_type: ReferenceType,
        reference_id: u64,
    ) -> Self {
        Self {
            text: format!("{prefix}:{reference_id}"),
            entry_type,
            reference_type,
            reference_id,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this key belongs on an entry of this type and reference (a `WDR_CONFIRM:7` key
    /// only on the DEBIT of withdrawal 7).
    pub fn fits(
        &self,
        entry_type: EntryType,
        reference_type: ReferenceType,
        reference_id: u64,
    ) -> bool {
        self.entry_type == entry_type
            && self.reference_type == reference_type
            && self.reference_id == reference_id
    }
}

impl fmt::Display for IdemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_seed_convention() {
        assert_eq!(
            IdemKey::withdrawal_confirm(1989).as_str(),
            "WDR_CONFIRM:1989"
        );
        assert_eq!(IdemKey::deposit_credit(7).to_string(), "DEP_CREDIT:7");
        assert_eq!(IdemKey::deposit_fee(7).as_str(), "DEP_FEE:7");
        // The longest possible key still fits VARCHAR(80).
        assert!(IdemKey::withdrawal_confirm(u64::MAX).as_str().len() <= 80);
    }

    #[test]
    fn a_key_fits_only_its_own_entry() {
        let key = IdemKey::withdrawal_confirm(7);
        assert!(key.fits(EntryType::Debit, ReferenceType::Withdrawal, 7));
        assert!(!key.fits(EntryType::Debit, ReferenceType::Withdrawal, 8));
        assert!(!key.fits(EntryType::Credit, ReferenceType::Withdrawal, 7));
        assert!(!key.fits(EntryType::Debit, ReferenceType::Deposit, 7));
    }
}
