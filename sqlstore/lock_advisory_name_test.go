package sqlstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/lock"
)

// TestMySQLGetLockNameBytes: the server bounds a lock name by bytes too
// (MariaDB: 192, the bytes of 64 three-byte characters), so a name of 64
// four-byte characters, within MaxMySQLLockName, is refused by the server
// with "Identifier name ... is too long" (1059). The helper refuses it
// first with ErrInvalidName, as every name the server would refuse, and
// takes a name of MaxMySQLLockNameBytes.
func TestMySQLGetLockNameBytes(t *testing.T) {
	t.Parallel()
	db := servers[1].open(t, "")
	ctx := t.Context()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	long := strings.Repeat("😀", lock.MaxMySQLLockName) // 256 bytes
	if _, err := lock.MySQLTryGetLock(ctx, conn, long); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("GET_LOCK of %d characters, %d bytes = %v, want ErrInvalidName", lock.MaxMySQLLockName, len(long), err)
	}
	fits := strings.Repeat("😀", lock.MaxMySQLLockNameBytes/4)
	release, err := lock.MySQLTryGetLock(ctx, conn, fits)
	if err != nil {
		t.Fatalf("GET_LOCK of %d bytes: %v", len(fits), err)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
}
