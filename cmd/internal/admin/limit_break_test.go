package admin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/admin"
)

// An Authorization header of another scheme than Bearer is not a token
// check: a proxy's HTTP Basic authentication in front of the page makes
// the browser send one with every request. The session's cookie decides,
// and no failed login is counted, logged or locked out.
func TestLoginLimitOtherAuthScheme(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	cookie, csrf := f.login(t)
	var body string
	basic := func(method, path string, form url.Values) int {
		t.Helper()
		var req *http.Request
		if form != nil {
			req = httptest.NewRequest(method, "http://shop.test"+path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req = httptest.NewRequest(method, "http://shop.test"+path, nil)
		}
		req.RemoteAddr = "192.0.2.7:41000"
		req.SetBasicAuth("operator", "proxy-password")
		req.AddCookie(&http.Cookie{Name: "idem_admin", Value: cookie})
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		body = rec.Body.String()
		return rec.Code
	}
	for i := range 40 {
		if code := basic("GET", "/admin/", nil); code != http.StatusOK {
			t.Fatalf("page %d with the session and a Basic header: %d, want 200", i, code)
		}
	}
	form := url.Values{"csrf": {csrf}, "scope64": {"YWNjdC03"}, "key64": {"c2VjcmV0LWtleS0x"}, "confirm": {"yes"}}
	if code := basic("POST", "/admin/evict", form); code != http.StatusSeeOther || f.recordExists(t) {
		t.Fatalf("evict with the session and a Basic header: %d, record there: %v", code, f.recordExists(t))
	}
	if strings.Contains(f.log.String(), "failed login") || strings.Contains(f.log.String(), "too many") {
		t.Fatalf("requests of a session were counted as failed logins:\n%s", f.log)
	}
	// Without a session, a Basic header is answered 401 (the page: with
	// the login form), uncounted: the right token still signs in from the
	// same client after 40 of them.
	cookie = ""
	if code := basic("GET", "/admin/", nil); code != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) {
		t.Fatalf("the page with Basic and no session: %d, want 401 with the login form:\n%s", code, body)
	}
	for range 40 {
		if code := basic("GET", "/admin/counters.json", nil); code != http.StatusUnauthorized {
			t.Fatalf("Basic without a session: %d, want 401", code)
		}
	}
	if a := f.try(t, "192.0.2.7:41000", token, true); a.code != http.StatusOK {
		t.Fatalf("the right bearer token after 40 Basic requests: %d, want 200", a.code)
	}
}

// What holds: requests that are not token checks never count (a wrong or
// expired session cookie, a post with a wrong CSRF token), the spellings
// of one address are one client (IPv4-mapped IPv6, zones, any address of
// a /64), a remote address that is not an IP (a unix socket, a pipe) is
// one client of its own, and during a lockout of everyone an open session
// still acts.
func TestLoginLimitHolds(t *testing.T) {
	clk := newClock()
	f := setup(t, func(c *admin.Config) { c.Now = clk.Now })
	cookie, csrf := f.login(t)
	for range 40 {
		if a := f.send(t, "GET", "/admin/", "cookie:not-a-session", nil); a.code != http.StatusUnauthorized {
			t.Fatalf("a wrong cookie: %d, want 401", a.code)
		}
		if a := f.send(t, "POST", "/admin/retry", "cookie:"+cookie, url.Values{"csrf": {"wrong"}}); a.code != http.StatusForbidden {
			t.Fatalf("a wrong CSRF token: %d, want 403", a.code)
		}
	}
	if strings.Contains(f.log.String(), "failed login") {
		t.Fatalf("a cookie or a CSRF failure was counted as a failed login:\n%s", f.log)
	}
	if a := f.send(t, "GET", "/admin/", "bearer:"+token, nil); a.code != http.StatusOK {
		t.Fatalf("the right token after 80 non-login failures: %d", a.code)
	}

	for _, tc := range []struct{ lock, other string }{
		{"198.51.100.4:5000", "[::ffff:198.51.100.4]:6000"},
		{"[::ffff:198.51.100.9]:5000", "198.51.100.9:6000"},
		{"[fe80::1%eth0]:5000", "[fe80::2%eth1]:6000"},
		{"[2001:db8:5:6::1]:5000", "[2001:db8:5:6:ffff:ffff:ffff:ffff]:6000"},
		{"pipe", "pipe"},
		{"@", "@"},
		{"", ""},
	} {
		for i := range 6 {
			if a := f.try(t, tc.lock, "wrong-token-wrong-token", i%2 == 0); a.code != http.StatusUnauthorized {
				t.Fatalf("%q failure %d: %d", tc.lock, i, a.code)
			}
		}
		if a := f.try(t, tc.other, token, false); a.code != http.StatusTooManyRequests {
			t.Fatalf("%q locked out, %q: %d, want 429", tc.lock, tc.other, a.code)
		}
		clk.add(time.Minute) // stay under the global cap
	}
	if a := f.try(t, "[2001:db8:5:7::1]:5000", token, false); !loggedIn(a) {
		t.Fatalf("the next /64: %d, want a login", a.code)
	}

	// A flood of wrong tokens from many addresses locks everyone out, for
	// as long as it lasts; the open session still reads and acts.
	for minute := range 5 {
		for i := range 31 {
			f.try(t, fmt.Sprintf("[2001:db8:%x:%x::1]:1000", minute, i), "wrong-token-wrong-token", false)
		}
		wantRefused(t, fmt.Sprintf("minute %d of the flood", minute), f.try(t, "192.0.2.7:41000", token, true), 60)
		if a := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil); a.code != http.StatusOK {
			t.Fatalf("minute %d of the flood: the open session's page: %d", minute, a.code)
		}
		clk.add(time.Minute)
	}
	form := url.Values{"csrf": {csrf}, "scope64": {"YWNjdC03"}, "key64": {"c2VjcmV0LWtleS0x"}, "confirm": {"yes"}}
	if a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, form); a.code != http.StatusSeeOther || f.recordExists(t) {
		t.Fatalf("evict in a session during the flood: %d, record there: %v", a.code, f.recordExists(t))
	}
}
