// Package fsm keeps a row's status on a declared state machine, with one
// conditional UPDATE per transition.
//
// A [Machine] is declared once ([New] refuses an inconsistent declaration)
// and bound to a table with [NewTable]. There are two ways to move a row,
// by what the caller names: [Table.Transition] names a target state (the
// row moves there from any state a declared transition leads from), and
// [Table.Fire] names a declared transition (the row moves along that edge
// only). Both run one conditional UPDATE:
//
//	UPDATE orders SET status = 'PAID', version = version + 1
//	WHERE id = ? AND status IN ('WAIT_PAY') [AND version = ?]
//
// When the statement updates no row, the row is read to say why: already
// in the target state is an idempotent success ([Result].AlreadyApplied);
// otherwise an [*IllegalTransitionError] (the row is in a state, Current,
// that is not among the Allowed sources of the Target; CurrentKnown is
// false when no statement ran and the row's state is unknown), a [*ConflictError] (its version is not the expected
// one, or it changed meanwhile) or [ErrNotFound].
//
// # What it guarantees
//
//   - A transition is one statement: of any number of concurrent callers
//     moving one row, the database lets exactly one change it from a given
//     state; the others get AlreadyApplied (they asked for the same target)
//     or an IllegalTransitionError that names the state the winner left
//     the row in.
//   - A row only ever changes along a declared edge, and every transition
//     increments the version column. The status is compared byte for byte
//     whatever the column's collation: on MySQL/MariaDB, whose default
//     collations take 'paid' for 'PAID' and 'cafe' for 'café', a row
//     holding a value the machine does not declare does not move as the
//     declared state it resembles. A PostgreSQL CHAR(n) column's padding
//     is not part of the state.
//   - Columns given with [Set] and [SetNow] change in the same statement,
//     so they change if and only if the status does.
//   - With a *sql.Tx, the transition commits or rolls back with the
//     caller's other writes: a side effect recorded in the same
//     transaction happens once, by the caller that was not AlreadyApplied.
//   - Identifiers (table and columns) are checked to be plain identifiers;
//     values always travel as parameters.
//
// # What it does not guarantee
//
//   - AlreadyApplied says the row is in the target state, not that this
//     caller's earlier attempt put it there: another caller may have. Do
//     the transition's side effects only when AlreadyApplied is false, in
//     the same transaction, or make them idempotent themselves.
//   - A row whose status column holds a value the machine does not
//     declare cannot move (every transition answers IllegalTransitionError);
//     fsm does not create rows: insert them in the initial state.
//   - Result.Previous is known only when the transition had one possible
//     source; reading the previous state otherwise would cost a statement.
//   - On PostgreSQL in a REPEATABLE READ or SERIALIZABLE transaction, a row
//     updated by another transaction since the snapshot fails the UPDATE
//     with SQLSTATE 40001 (serialization_failure), returned wrapped: retry
//     the transaction. On a *sql.DB (each statement its own transaction)
//     fsm runs such a statement again itself, up to 5 times, so that a
//     race loser under a REPEATABLE READ or SERIALIZABLE session default
//     gets AlreadyApplied or the IllegalTransitionError, as under READ
//     COMMITTED. It does not classify MySQL errors (it imports no driver). On MySQL/MariaDB the read after a refused UPDATE is
//     a locking read (LOCK IN SHARE MODE), so that under REPEATABLE READ it
//     sees the latest committed row and not the transaction's snapshot.
//
// # Shapes
//
// New(def *Definition) and NewTable(m, cfg *TableConfig) refuse a nil
// argument and copy what they are given; TableConfig.Dialect takes a
// sqldialect.Dialect (sqldialect.PostgreSQL, or sqlstore.PostgreSQL as
// it is). The calls that move a row take (ctx, q, id, target or name,
// opts...): per-call [Option]s ([IfVersion], [Set], [SetNow]) come last.
// Errors are a sentinel matched with errors.Is ([ErrIllegal],
// [ErrConflict], [ErrNotFound], [ErrUnknownState], [ErrUnknownTransition])
// and, for the first two, a typed error with the details
// ([*IllegalTransitionError], [*ConflictError]) whose Is matches it.
//
// # Declaration rules
//
// New refuses self-loops (a transition must change the state, or a retry
// could not be told from a new call), an edge out of a final state, an edge
// declared twice, a state that cannot be reached from the initial state, a
// state that is not final and that no transition leaves, unknown states
// and duplicate names. See New for the whole list.
package fsm
