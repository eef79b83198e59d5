package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"time"
)

// IDLen is the length, in bytes, of what NewID appends to its prefix.
const IDLen = 26

// crockford is Crockford's base32 alphabet (no I, L, O, U), in the order
// of the values, so that IDs of one prefix sort as their times do.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// NewID returns prefix followed by a new message ID of IDLen characters:
// 128 bits in Crockford's base32, the first 48 the current unix time in
// milliseconds and the other 80 from crypto/rand (a ULID). IDs made in
// one millisecond, by any process on any host, collide with a
// probability of about n²/2⁸¹ for n of them; IDs of one prefix made in
// different milliseconds sort as their times. The stores call it when a
// message is added: its ID then depends neither on the row's id, which a
// database re-created or restored from a backup gives again to another
// message, nor on the database, nor on a configuration that may change
// before the message is published.
func NewID(prefix string) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand)
	out := make([]byte, len(prefix)+IDLen)
	copy(out, prefix)
	encode(out[len(prefix):], b)
	return string(out)
}

// encode writes b's 128 bits to dst's 26 characters, 5 bits a character
// from the most significant, the first character taking the top 3 bits
// (so it is 0 to 7).
func encode(dst []byte, b [16]byte) {
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	for i := IDLen - 1; i >= 0; i-- {
		dst[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
}
