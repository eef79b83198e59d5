package redisstore

// RecordKey exposes recordKey to the tests.
func (s *Store) RecordKey(scope, key string) string { return s.recordKey(scope, key) }

// Prefix returns the store's prefix.
func (s *Store) Prefix() string { return s.prefix }

// Exported for the tests.
var (
	EncodeHeader = encodeHeader
	DecodeHeader = decodeHeader
)
