package sqlstore

// OwnStatementsInReadCommitted reports whether s has found that its
// sessions default to an isolation level above READ COMMITTED, so that
// its own statements run in READ COMMITTED transactions of their own
// (known is false before its first statement).
func OwnStatementsInReadCommitted(s *Store) (rc, known bool) {
	switch s.own.state.Load() {
	case ownAlone:
		return false, true
	case ownReadCommitted:
		return true, true
	}
	return false, false
}
