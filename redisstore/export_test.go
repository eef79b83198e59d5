package redisstore

// RecordKey exposes recordKey to the tests.
func (s *Store) RecordKey(scope, key string) string { return s.recordKey(scope, key) }

// Exported for the tests.
var (
	EncodeHeader = encodeHeader
	DecodeHeader = decodeHeader
)
