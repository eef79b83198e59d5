package shop_test

import (
	"errors"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
)

// browse follows GET target's redirects like a browser (at most 20, as
// Chromium does), with a cookie jar or without one (a browser that
// refuses cookies); extra are cookies sent with every request. It
// returns the last response and the number of redirects followed.
func browse(t *testing.T, srv *httptest.Server, target string, jar bool, extra ...*http.Cookie) (*http.Response, string, int) {
	t.Helper()
	c := srv.Client()
	if jar {
		j, err := cookiejar.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Jar = j
	}
	hops := 0
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		hops = len(via)
		if len(via) >= 20 {
			return errors.New("too many redirects")
		}
		for _, k := range extra {
			req.AddCookie(k)
		}
		return nil
	}
	req, err := http.NewRequestWithContext(t.Context(), "GET", srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	for _, k := range extra {
		req.AddCookie(k)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (cookies kept: %v): %v after %d redirects", target, jar, err, hops)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, b.String(), hops
}

// A browser that refuses cookies is not sent round in circles: GET / (or
// /?uid=N) answers one redirect, then a page that says cookies are
// needed, with no token issued; a browser that keeps them gets the
// checkout page. A uid cookie that is not a user (a hostile value, or a
// second uid cookie of a parent domain sent first) does not loop either.
func TestCookiesRefused(t *testing.T) {
	t.Parallel()
	s, db := webShop(t, sqliteBackend)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	for _, target := range []string{"/", "/?uid=4"} {
		resp, body, hops := browse(t, srv, target, false)
		if resp.StatusCode == http.StatusOK || hops > 1 || !strings.Contains(body, "cookie") {
			t.Errorf("GET %s without cookies: %d after %d redirects, want a page about cookies after at most 1\n%s", target, resp.StatusCode, hops, body)
		}
		if tokenField.MatchString(body) {
			t.Errorf("GET %s without cookies: a token in the page", target)
		}
	}
	if n := count(t, db, "SELECT COUNT(*) FROM idem_tokens"); n != 0 {
		t.Fatalf("%d tokens issued to clients without cookies, want 0", n)
	}
	for _, target := range []string{"/", "/?uid=4"} {
		resp, body, _ := browse(t, srv, target, true)
		if resp.StatusCode != http.StatusOK || !tokenField.MatchString(body) {
			t.Errorf("GET %s with cookies: %d\n%s", target, resp.StatusCode, body)
		}
	}
	// A parent domain's hostile uid cookie, sent before the shop's own.
	resp, body, hops := browse(t, srv, "/", true, &http.Cookie{Name: "uid", Value: "x<script>"})
	if resp.StatusCode != http.StatusOK || hops > 1 || !tokenField.MatchString(body) || strings.Contains(body, "<script>") {
		t.Errorf("GET / with a hostile uid cookie first: %d after %d redirects\n%s", resp.StatusCode, hops, body)
	}
}
