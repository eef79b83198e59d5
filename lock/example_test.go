package lock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/idemkit/idem/lock"
)

func Example() {
	ctx := context.Background()
	// Any Backend: sqlstore.NewLockBackend on PostgreSQL or MySQL for a
	// fence from the database, redisstore.NewLockBackend for speed.
	locker, err := lock.New(lock.NewMemoryBackend(), &lock.Config{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}

	lease, err := locker.Acquire(ctx, "nightly-report") // waits while another holds it
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// The watchdog renews the lease; work stops when it is lost.
	work, cancel := lease.Context(ctx)
	defer cancel()

	// The protected resource refuses a holder whose fence is stale:
	//   UPDATE reports SET body = ?, last_fence = ? WHERE id = ? AND last_fence < ?
	fmt.Println("fence", lease.Fence(), "working:", work.Err() == nil)
	// Output: fence 1 working: true
}

func ExampleNew() {
	locker, err := lock.New(lock.NewMemoryBackend(), nil) // defaults
	if err != nil {
		log.Fatal(err)
	}
	c := locker.Config()
	fmt.Println(c.TTL, c.MaxHold, c.RetryMin, c.RetryMax)
	// Output: 30s 10m0s 10ms 1s
}

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	locker, err := lock.New(lock.NewMemoryBackend(), nil)
	if err != nil {
		log.Fatal(err)
	}
	first, err := locker.TryAcquire(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	_, err = locker.TryAcquire(ctx, "job")
	fmt.Println(errors.Is(err, lock.ErrHeld))

	_ = first.Release(ctx)
	second, err := locker.TryAcquire(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Fence(), second.Fence()) // the fence survives the release
	_ = second.Release(ctx)
	// Output:
	// true
	// 1 2
}

func ExampleLocker_Acquire() {
	ctx := context.Background()
	locker, err := lock.New(lock.NewMemoryBackend(), nil)
	if err != nil {
		log.Fatal(err)
	}
	held, err := locker.Acquire(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	defer held.Release(ctx)

	// Acquire retries until its context ends.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = locker.Acquire(short, "job")
	fmt.Println(errors.Is(err, lock.ErrHeld), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

func ExampleLease_Context() {
	ctx := context.Background()
	locker, err := lock.New(lock.NewMemoryBackend(), nil)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	work, cancel := lease.Context(ctx)
	defer cancel()

	_ = lease.Release(ctx)
	<-work.Done()
	fmt.Println(context.Cause(work))
	// Output: lock: lease released
}

func ExampleLease_Done() {
	ctx := context.Background()
	locker, err := lock.New(lock.NewMemoryBackend(), nil)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = lease.Release(ctx) }()
	<-lease.Done() // closed when the lease is lost, runs out at MaxHold, or is released
	fmt.Println(lease.Err())
	// Output: lock: lease released
}

func ExampleNewMemoryBackend() {
	ctx := context.Background()
	b := lock.NewMemoryBackend()
	owner := lock.NewOwner()
	fence, err := b.Acquire(ctx, "job", owner, time.Minute)
	fmt.Println(fence, err)
	fmt.Println(b.Release(ctx, "job", lock.NewOwner(), fence)) // not the owner
	fmt.Println(b.Release(ctx, "job", owner, fence))
	// Output:
	// 1 <nil>
	// lock: not held
	// <nil>
}

func ExampleValidateName() {
	fmt.Println(lock.ValidateName("reports/2026-11"))
	fmt.Println(lock.ValidateName(""))
	// Output:
	// <nil>
	// lock: invalid name: empty
}

func ExamplePGAdvisoryKey() {
	fmt.Println(lock.PGAdvisoryKey("job"))
	// Output: 6812988570718632683
}

// db is a PostgreSQL or MySQL database (see sqlstore's tests for runs on
// real servers).
var db *sql.DB

func ExamplePGAdvisoryXactLock() {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := lock.PGAdvisoryXactLock(ctx, tx, "monthly-invoices"); err != nil {
		log.Fatal(err)
	}
	// … the work, in tx; the lock ends with the transaction.
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

func ExamplePGTryAdvisoryXactLock() {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	err = lock.PGTryAdvisoryXactLock(ctx, tx, "monthly-invoices")
	if errors.Is(err, lock.ErrHeld) {
		return // another transaction does the work
	}
	if err != nil {
		log.Fatal(err)
	}
	// … the work, in tx.
	_ = tx.Commit()
}

func ExampleMySQLGetLock() {
	ctx := context.Background()
	conn, err := db.Conn(ctx) // the lock belongs to this session
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	release, err := lock.MySQLGetLock(wait, conn, "shop:monthly-invoices")
	if errors.Is(err, lock.ErrHeld) {
		return // still held by another session after 5 s
	}
	if err != nil {
		log.Fatal(err)
	}
	defer release(ctx)
	// … the work.
}

func ExampleMySQLTryGetLock() {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	release, err := lock.MySQLTryGetLock(ctx, conn, "shop:monthly-invoices")
	if errors.Is(err, lock.ErrHeld) {
		return // another session does the work
	}
	if err != nil {
		log.Fatal(err)
	}
	defer release(ctx)
	// … the work.
}
