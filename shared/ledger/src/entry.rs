//! What an entry is: its direction ([`EntryType`]) and what caused it ([`ReferenceType`]).

use std::fmt;

use paybus_money::Amount;

/// How an entry moves the balance: CREDIT adds, DEBIT and FEE subtract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryType {
    Debit,
    Credit,
    Fee,
}

impl EntryType {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryType::Debit => "DEBIT",
            EntryType::Credit => "CREDIT",
            EntryType::Fee => "FEE",
        }
    }

    /// The entry's effect on the balance: `amount` for a CREDIT, `-amount` otherwise.
    pub fn signed(self, amount: Amount) -> Amount {
        match self {
            EntryType::Credit => amount,
            EntryType::Debit | EntryType::Fee => amount.negated(),
        }
    }
}

impl fmt::Display for EntryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an entry is about: `reference_type` + `reference_id` name the row that caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReferenceType {
    /// `withdrawals.id`: the confirmation DEBIT, and P2P legs / corrections on a withdrawal.
    Withdrawal,
    /// `deposits.id`: the confirmation CREDIT and FEE.
    Deposit,
    /// A P2P match's settlement (CREDIT and FEE per match).
    P2pSettlement,
    /// Settlement inflow.
    Settlement,
    /// A manual correction or a migrated balance (seed 001: ledger 12282 MIGRATION CREDIT).
    Migration,
}

impl ReferenceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ReferenceType::Withdrawal => "WITHDRAWAL",
            ReferenceType::Deposit => "DEPOSIT",
            ReferenceType::P2pSettlement => "P2P_SETTLEMENT",
            ReferenceType::Settlement => "SETTLEMENT",
            ReferenceType::Migration => "MIGRATION",
        }
    }
}

impl fmt::Display for ReferenceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
