//! What a batch's transition has decided so far, one decision per confirmation in order: an
//! entity named again later in the batch is decided on the state its first confirmation
//! leaves, as if the two had come one after the other. The rows that move are decided once
//! their transition is written.

use std::collections::HashMap;

use paybus_bus::transition::Transition;

use crate::ConfirmError;

/// A confirmation's decision; `None` for a row that moves until its transition is written.
type Decided<T, S> = Option<Transition<T, S>>;

/// The rows that move (position in the batch, the row as locked), and the decisions by
/// position to fill for them.
type Moving<'a, T, S, R> = (&'a mut [(usize, R)], &'a mut [Decided<T, S>]);

/// The decisions of a batch of confirmations of entities whose state is `S`, with the rows
/// (`R`, as locked) that move and what their transitions write (`T`).
pub(crate) struct Decisions<T, S, R> {
    /// The state each entity is left in by the batch's earlier confirmations (`None`: it does
    /// not exist).
    left: HashMap<u64, Option<S>>,
    /// One per confirmation so far.
    decided: Vec<Decided<T, S>>,
    /// (position in the batch, the row as locked)
    moving: Vec<(usize, R)>,
}

impl<T, S: Clone, R> Decisions<T, S, R> {
    /// For a batch of `size` confirmations.
    pub(crate) fn new(size: usize) -> Self {
        Decisions {
            left: HashMap::new(),
            decided: Vec::with_capacity(size),
            moving: Vec::new(),
        }
    }

    /// Decides the next confirmation, of `id`, on the state an earlier confirmation of the
    /// batch left it in; false, deciding nothing, when none named it.
    pub(crate) fn decide_repeat(&mut self, id: u64) -> bool {
        let Some(state) = self.left.get(&id) else {
            return false;
        };
        self.decided.push(Some(match state {
            Some(current) => Transition::NotTransitioned {
                current: current.clone(),
            },
            None => Transition::NotFound,
        }));
        true
    }

    /// The next confirmation's entity, `id`, has no row.
    pub(crate) fn not_found(&mut self, id: u64) {
        self.left.insert(id, None);
        self.decided.push(Some(Transition::NotFound));
    }

    /// The next confirmation's entity, `id`, is in `current`, which it does not move from.
    pub(crate) fn not_transitioned(&mut self, id: u64, current: S) {
        self.left.insert(id, Some(current.clone()));
        self.decided
            .push(Some(Transition::NotTransitioned { current }));
    }

    /// The next confirmation, at `position` in the batch, moves `row` (entity `id`) to
    /// `leaves`.
    pub(crate) fn moves(&mut self, position: usize, id: u64, row: R, leaves: S) {
        self.left.insert(id, Some(leaves));
        self.decided.push(None);
        self.moving.push((position, row));
    }

    /// The rows that move and their decisions to fill; `None` when no row moves.
    pub(crate) fn moving(&mut self) -> Option<Moving<'_, T, S, R>> {
        if self.moving.is_empty() {
            None
        } else {
            Some((&mut self.moving, &mut self.decided))
        }
    }

    /// The decisions of the batch's `size` confirmations, in order ([`ConfirmError::Incomplete`]
    /// when one is missing).
    pub(crate) fn into_decided(
        self,
        entity: &'static str,
        size: usize,
    ) -> Result<Vec<Transition<T, S>>, ConfirmError> {
        let decided: Vec<Transition<T, S>> = self.decided.into_iter().flatten().collect();
        if decided.len() != size {
            return Err(ConfirmError::Incomplete {
                entity,
                expected: size as u64,
                moved: decided.len() as u64,
            });
        }
        Ok(decided)
    }
}
