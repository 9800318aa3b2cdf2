//! End-to-end scenarios against the real MariaDB and RabbitMQ: the tests live in `tests/tests/`,
//! and this crate has no library code of its own. Its binaries (`src/bin`) are the deliberately
//! broken builds the chaos run must catch: confirm-withdrawal with the seed's read-then-update,
//! and match-deposit releasing a fill on a createTrade timeout.
