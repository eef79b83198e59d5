package idemcli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// changingReader is the operator's answer, typed after something changed
// the store: before its first read it runs change.
type changingReader struct {
	change func()
	r      io.Reader
}

func (c *changingReader) Read(p []byte) (int, error) {
	if c.change != nil {
		c.change()
		c.change = nil
	}
	return c.r.Read(p)
}

// idem evict deletes the record it printed, or nothing: a record replaced
// while the operator read it (deleted and run again by a new request,
// which gives it the same fence and another owner) is kept, and the
// command says so and fails.
func TestEvictChangedBeforeAnswer(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	ctx := context.Background()
	put(t, st.store, "tenant", "k", time.Minute, time.Hour, &idem.Response{StatusCode: 201, Body: []byte("first")})
	printed, err := st.store.Get(ctx, "tenant", "k")
	if err != nil {
		t.Fatal(err)
	}
	stdin := &changingReader{r: strings.NewReader("y\n"), change: func() {
		if err := st.store.Delete(ctx, "tenant", "k"); err != nil {
			t.Error(err)
		}
		put(t, st.store, "tenant", "k", time.Minute, time.Hour, &idem.Response{StatusCode: 202, Body: []byte("second")})
	}}
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"evict", "-db", raw, "-scope", "tenant", "-key", "k"}, stdin, &stdout, &stderr)
	if code != exitFail || !strings.Contains(stdout.String(), "Delete this record?") || !strings.Contains(stderr.String(), "changed since it was printed") {
		t.Fatalf("evict of a record replaced before the answer: exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	if strings.Contains(stdout.String(), "\ndeleted") {
		t.Fatalf("evict says it deleted:\n%s", stdout.String())
	}
	rec, err := st.store.Get(ctx, "tenant", "k")
	if err != nil || rec.Owner == printed.Owner || rec.Response == nil || string(rec.Response.Body) != "second" {
		t.Fatalf("after the refused evict: %+v, %v; want the new request's record", rec, err)
	}
}

// idem evict refuses a record in flight unless -force: with -yes and
// without -force it deletes nothing and says why (without asking); with
// -force it deletes it.
func TestEvictInFlightNeedsForce(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	put(t, st.store, "tenant", "k", time.Minute, time.Hour, nil)
	has := func() bool {
		_, err := st.store.Get(context.Background(), "tenant", "k")
		if err != nil && !errors.Is(err, idem.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	for _, args := range [][]string{{"-yes"}, {}} {
		code, out, errOut := run(t, "y\n", append([]string{"evict", "-db", raw, "-scope", "tenant", "-key", "k"}, args...)...)
		if code != exitFail || !strings.Contains(errOut, "in flight") || !strings.Contains(errOut, "-force") || strings.Contains(out, "Delete this record?") || !has() {
			t.Fatalf("evict %v of a record in flight: exit %d %q %q, record kept %v; want it refused and kept", args, code, out, errOut, has())
		}
	}
	if code, out, errOut := run(t, "y\n", "evict", "-db", raw, "-scope", "tenant", "-key", "k", "-force"); code != exitOK || !strings.Contains(out, "deleted") || has() {
		t.Fatalf("evict -force of a record in flight: exit %d %q %q, record kept %v; want it deleted", code, out, errOut, has())
	}
}
