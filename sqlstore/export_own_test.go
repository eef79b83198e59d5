package sqlstore

// OwnStatementsInReadCommitted reports whether s has found that its
// sessions default to an isolation level above READ COMMITTED, so that
// its own statements run in READ COMMITTED transactions of their own
// (known is false before its first statement).
func OwnStatementsInReadCommitted(s *Store) (rc, known bool) { return s.own.inReadCommittedState() }

// InboxOwnStatementsInReadCommitted is OwnStatementsInReadCommitted for
// an InboxStore.
func InboxOwnStatementsInReadCommitted(s *InboxStore) (rc, known bool) {
	return s.own.inReadCommittedState()
}

// OutboxOwnStatementsInReadCommitted is OwnStatementsInReadCommitted for
// an OutboxStore.
func OutboxOwnStatementsInReadCommitted(s *OutboxStore) (rc, known bool) {
	return s.own.inReadCommittedState()
}

func (o *ownStatements) inReadCommittedState() (rc, known bool) {
	switch o.state.Load() {
	case ownAlone:
		return false, true
	case ownReadCommitted:
		return true, true
	}
	return false, false
}
