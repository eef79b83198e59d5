package idem

import "log/slog"

// The attribute names of idem's log lines (log/slog), the same in every
// package of the project; see "Logs" in the package documentation.
const (
	LogKeyHash = "idem.key_hash" // HashKey of the record's scope and key
	LogScope   = "idem.scope"    // the scope, only when keys are logged (LogKeys)
	LogKeyRaw  = "idem.key"      // the key, only when keys are logged (LogKeys)
	LogRoute   = "idem.route"    // the route pattern or gRPC method
	LogOutcome = "idem.outcome"  // an Outcome* constant
	LogStore   = "idem.store"    // the store's name
	LogFence   = "idem.fence"    // the lease's fence
	LogStatus  = "idem.status"   // an HTTP status
	LogErr     = "err"           // the error
)

// LogKey returns the attribute that identifies (scope, key) in a log line:
// idem.key_hash alone, or, when raw is set (the operator opted in to
// logging keys), a group of idem.key_hash, idem.scope and idem.key that
// a handler writes as those three attributes. The hash is computed when
// a handler writes the line (it is a slog.LogValuer), not for a line
// that is not logged.
func LogKey(scope, key string, raw bool) slog.Attr {
	h := slog.Any(LogKeyHash, keyHashValue{scope, key})
	if !raw {
		return h
	}
	return slog.Group("", h, slog.String(LogScope, scope), slog.String(LogKeyRaw, key))
}

// keyHashValue logs as HashKey(scope, key), computed when logged.
type keyHashValue struct{ scope, key string }

func (v keyHashValue) LogValue() slog.Value { return slog.StringValue(HashKey(v.scope, v.key)) }
