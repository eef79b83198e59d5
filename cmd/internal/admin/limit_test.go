package admin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/admin"
)

// clock is a settable clock for Config.Now.
type clock struct{ now atomic.Pointer[time.Time] }

func newClock() *clock {
	c := &clock{}
	t0 := time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC) // on a minute
	c.now.Store(&t0)
	return c
}

func (c *clock) Now() time.Time { return *c.now.Load() }

func (c *clock) add(d time.Duration) {
	t := c.Now().Add(d)
	c.now.Store(&t)
}

// try posts the login form with tok from the address remote (or, when
// bearer, sends tok as a bearer token to GET /admin/) and returns the
// answer.
func (f *fixture) try(t *testing.T, remote, tok string, bearer bool) answer {
	t.Helper()
	var req *http.Request
	if bearer {
		req = httptest.NewRequest("GET", "http://shop.test/admin/", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
	} else {
		req = httptest.NewRequest("POST", "http://shop.test/admin/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return answer{rec.Code, string(body), rec.Header()}
}

// loggedIn reports whether a answered a login with a session cookie.
func loggedIn(a answer) bool {
	resp := http.Response{Header: a.header}
	for _, c := range resp.Cookies() {
		if c.Name == "idem_admin" && c.Value != "" {
			return a.code == http.StatusSeeOther
		}
	}
	return false
}

// wantRefused checks that a is a 429 whose Retry-After is want seconds.
func wantRefused(t *testing.T, what string, a answer, want int) {
	t.Helper()
	if a.code != http.StatusTooManyRequests {
		t.Fatalf("%s: %d, want 429", what, a.code)
	}
	if loggedIn(a) || strings.Contains(a.body, "acct-7") {
		t.Fatalf("%s: a refused attempt signed in or showed the page", what)
	}
	got, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || got != want {
		t.Fatalf("%s: Retry-After %q, want %d", what, a.header.Get("Retry-After"), want)
	}
}

// After five failed logins in a row, each further failure locks the
// client out for a delay that doubles from 1 s up to 5 minutes; during
// it every attempt, the right token too, is refused with 429 and
// Retry-After, and is not checked. After it the right token signs in,
// and a success forgets the client's failures.
func TestLoginLimit(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	const ip = "198.51.100.4:5000"
	for i := 1; i <= 6; i++ {
		if a := f.try(t, ip, "wrong-token-wrong-token", false); a.code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i, a.code)
		}
		clk.add(10 * time.Millisecond)
	}
	wantRefused(t, "7th attempt, at once", f.try(t, ip, "wrong-token-wrong-token", false), 1)
	wantRefused(t, "the right token during the lockout", f.try(t, ip, token, false), 1)
	wantRefused(t, "the right bearer token during the lockout", f.try(t, "198.51.100.4:6000", token, true), 1)
	// Another client is not locked out.
	if a := f.try(t, "198.51.100.5:5000", token, false); !loggedIn(a) {
		t.Fatalf("another client's login: %d", a.code)
	}
	clk.add(time.Second)
	if a := f.try(t, ip, "wrong-token-wrong-token", false); a.code != http.StatusUnauthorized {
		t.Fatalf("failure 7, after the delay: %d, want 401", a.code)
	}
	wantRefused(t, "after the 7th failure", f.try(t, ip, token, false), 2)
	clk.add(1500 * time.Millisecond)
	wantRefused(t, "half a second before the end", f.try(t, ip, token, true), 1)
	clk.add(500 * time.Millisecond)
	if a := f.try(t, ip, token, false); !loggedIn(a) {
		t.Fatalf("the right token after the delay: %d %s", a.code, a.body)
	}
	// The success forgot the failures: five are free again.
	for i := 1; i <= 6; i++ {
		if a := f.try(t, ip, "wrong-token-wrong-token", true); a.code != http.StatusUnauthorized {
			t.Fatalf("failure %d after a success: %d, want 401", i, a.code)
		}
	}
	wantRefused(t, "after six bearer failures", f.try(t, ip, token, true), 1)
	// The delay doubles up to 5 minutes.
	want := 1
	for i := 0; i < 12; i++ {
		a := f.try(t, ip, token, false)
		wantRefused(t, fmt.Sprintf("lockout %d", i), a, want)
		clk.add(time.Duration(want) * time.Second)
		if a := f.try(t, ip, "wrong-token-wrong-token", false); a.code != http.StatusUnauthorized {
			t.Fatalf("failure after lockout %d: %d", i, a.code)
		}
		want = min(want*2, 300)
	}
	if want != 300 {
		t.Fatalf("the test did not reach the cap: %d", want)
	}
	wantRefused(t, "at the cap", f.try(t, ip, token, false), 300)
}

// A refused attempt is logged once per lockout, not once per request.
func TestLoginLimitLogsOncePerLockout(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	const ip = "198.51.100.4:5000"
	for i := 0; i < 6; i++ {
		f.try(t, ip, "wrong-token-wrong-token", false)
	}
	for i := 0; i < 50; i++ {
		wantRefused(t, "lockout", f.try(t, ip, token, i%2 == 0), 1)
	}
	if n := strings.Count(f.log.String(), "too many failed logins"); n != 1 {
		t.Fatalf("%d log lines about the refusals, want 1:\n%s", n, f.log)
	}
	clk.add(time.Second)
	f.try(t, ip, "wrong-token-wrong-token", false)
	for i := 0; i < 50; i++ {
		wantRefused(t, "second lockout", f.try(t, ip, token, false), 2)
	}
	if n := strings.Count(f.log.String(), "too many failed logins"); n != 2 {
		t.Fatalf("%d log lines about the refusals of two lockouts, want 2:\n%s", n, f.log)
	}
}

// Past 30 failed logins in a minute, from any clients, every login is
// refused until the minute ends: an attack spread over many addresses is
// slowed too. A success meanwhile does not reset the count.
func TestLoginLimitGlobal(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	for i := 0; i < 29; i++ {
		if a := f.try(t, fmt.Sprintf("203.0.113.%d:1000", i), "wrong-token-wrong-token", i%2 == 0); a.code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i, a.code)
		}
	}
	before := f.try(t, "192.0.2.200:1000", token, false)
	if !loggedIn(before) {
		t.Fatalf("login before the cap: %d", before.code)
	}
	clk.add(20 * time.Second)
	if a := f.try(t, "203.0.113.100:1000", "wrong-token-wrong-token", false); a.code != http.StatusUnauthorized {
		t.Fatalf("30th failure: %d, want 401", a.code)
	}
	a := f.try(t, "192.0.2.201:1000", token, false)
	wantRefused(t, "a fresh client past the cap", a, 40)
	if !strings.Contains(a.body, "Too many failed logins: try again in 40 s") {
		t.Errorf("the refused form says not why:\n%s", a.body)
	}
	wantRefused(t, "a bearer past the cap", f.try(t, "[2001:db8::1]:1000", token, true), 40)
	clk.add(39 * time.Second)
	wantRefused(t, "a second before the minute ends", f.try(t, "192.0.2.201:1000", token, false), 1)
	if n := strings.Count(f.log.String(), "too many failed logins"); n != 1 {
		t.Fatalf("%d log lines about the refusals, want 1:\n%s", n, f.log)
	}
	// A session opened before the cap is not affected: only token checks
	// are limited.
	resp := http.Response{Header: before.header}
	if c := resp.Cookies(); len(c) != 1 || f.send(t, "GET", "/admin/", "cookie:"+c[0].Value, nil).code != http.StatusOK {
		t.Fatal("a session opened before the cap was refused")
	}
	clk.add(time.Second)
	if a := f.try(t, "192.0.2.201:1000", token, false); !loggedIn(a) {
		t.Fatalf("login in the next minute: %d", a.code)
	}
}

// Under a flood of distinct addresses the failures of at most a bounded
// number of clients are kept (the oldest are forgotten first), and the
// newest lockouts are among them.
func TestLoginLimitBounded(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	n := 0
	fail := func(remote string) {
		t.Helper()
		if a := f.try(t, remote, "wrong-token-wrong-token", false); a.code != http.StatusUnauthorized {
			t.Fatalf("failure from %s: %d, want 401", remote, a.code)
		}
		if n++; n%30 == 0 { // stay under the global cap
			clk.add(time.Minute)
		}
	}
	for i := 0; i < 1500; i++ {
		fail(fmt.Sprintf("10.%d.%d.1:1000", i/256, i%256))
	}
	const locked = "192.0.2.99:1000"
	for i := 0; i < 6; i++ {
		fail(locked)
	}
	if got := admin.Tracked(f.h); got > 1024 || got < 1000 {
		t.Fatalf("%d clients tracked after a flood of 1500, want at most 1024 (and about that many)", got)
	}
	a := f.try(t, locked, token, false)
	if a.code != http.StatusTooManyRequests {
		t.Fatalf("the newest lockout was forgotten in the flood: %d", a.code)
	}
	// IPv6 clients count by their /64: an attacker holding a prefix is one
	// client.
	for i := 0; i < 6; i++ {
		fail(fmt.Sprintf("[2001:db8:1:2::%x]:1000", i+1))
	}
	if a := f.try(t, "[2001:db8:1:2:ffff::9]:1000", token, false); a.code != http.StatusTooManyRequests {
		t.Fatalf("another address of a locked-out /64: %d, want 429", a.code)
	}
}

// Concurrent attempts of one client cannot all be checked before the
// first failures lock it out.
func TestLoginLimitConcurrent(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	var wrong, refused atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Go(func() {
			switch a := f.try(t, "198.51.100.4:5000", "wrong-token-wrong-token", i%2 == 0); a.code {
			case http.StatusUnauthorized:
				wrong.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
			default:
				t.Errorf("attempt %d: %d", i, a.code)
			}
		})
	}
	wg.Wait()
	if wrong.Load() != freeFailuresPlusOne || refused.Load() != 64-freeFailuresPlusOne {
		t.Fatalf("64 concurrent attempts: %d checked, %d refused; want %d checked", wrong.Load(), refused.Load(), freeFailuresPlusOne)
	}
}

// freeFailuresPlusOne is how many failures a client makes before its
// first refusal: five free ones, and the one that locks it out.
const freeFailuresPlusOne = 6
