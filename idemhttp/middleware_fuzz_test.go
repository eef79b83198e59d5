package idemhttp_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// FuzzMiddleware sends a POST with any Idempotency-Key value, Content-Type
// and body (padded past MaxRequestBody when asked), then a second one
// with the same key and another body:
//   - a key ParseKey refuses is answered 400 INVALID_KEY, a body over the
//     limit 413 BODY_TOO_LARGE (reading at most one byte past it), and the
//     handler never runs;
//   - otherwise the handler runs once, reading the body as sent; the
//     second request is a replay of the first answer when the two share a
//     fingerprint (the handler does not run again) and 422 KEY_MISMATCH
//     when they do not.
func FuzzMiddleware(f *testing.F) {
	for _, s := range [][4]string{
		{"order-1", "application/json", `{"b":1,"a":2}`, `{"a":2, "b":1}`},
		{`"order-1"`, "application/json", `{"a":1}`, `{"a":2}`},
		{"k", "text/plain", "x", "x "},
		{"k", "application/json", `{"a":1,"A":2}`, `{"A":2,"a":1}`},
		{"", "", "", ""},
		{"\x00", "", "", ""},
	} {
		f.Add(s[0], s[1], []byte(s[2]), []byte(s[3]), false)
	}
	f.Add("big", "application/octet-stream", []byte("x"), []byte("y"), true)
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, key, contentType string, body, other []byte, oversize bool) {
		store := memstore.New(nil)
		m, err := idemhttp.New(&idemhttp.Config{Store: store, MaxRequestBody: limit})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		var seen []byte
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			seen, _ = io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(append([]byte("run "), byte('0'+runs)))
		}))
		if oversize {
			body = append(body, bytes.Repeat([]byte{' '}, limit+1-len(body)%(limit+1))...)
		}
		send := func(b []byte) (*httptest.ResponseRecorder, *countingBody) {
			src := &countingBody{r: bytes.NewReader(b)}
			r := httptest.NewRequest(http.MethodPost, "/orders?x=1", src)
			r.Header.Set(idemhttp.HeaderIdempotencyKey, key)
			if contentType != "" {
				r.Header.Set("Content-Type", contentType)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w, src
		}
		first, src := send(body)
		_, keyErr := idemhttp.ParseKey(key)
		switch {
		case keyErr != nil:
			if first.Code != http.StatusBadRequest || !strings.Contains(first.Body.String(), idemhttp.CodeInvalidKey) || runs != 0 {
				t.Fatalf("key %q: %d %s, %d runs", key, first.Code, first.Body, runs)
			}
			return
		case len(body) > limit:
			if first.Code != http.StatusRequestEntityTooLarge || runs != 0 || src.n > limit+1 {
				t.Fatalf("a %d-byte body: %d, %d runs, %d bytes read", len(body), first.Code, runs, src.n)
			}
			return
		}
		if first.Code != http.StatusCreated || runs != 1 || !bytes.Equal(seen, body) {
			t.Fatalf("key %q body %q: %d %s, %d runs, handler read %q", key, body, first.Code, first.Body, runs, seen)
		}
		if len(other) > limit {
			return
		}
		r1 := httptest.NewRequest(http.MethodPost, "/orders?x=1", nil)
		r1.Header.Set("Content-Type", contentType)
		fp1, _ := idemhttp.FingerprintV1(r1, body)
		fp2, _ := idemhttp.FingerprintV1(r1, other)
		second, _ := send(other)
		if runs != 1 {
			t.Fatalf("the second request with key %q ran the handler", key)
		}
		if fp1 == fp2 {
			if second.Code != first.Code || second.Body.String() != first.Body.String() || second.Header().Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("bodies %q and %q share a fingerprint; the second got %d %q, want the replay of %d %q", body, other, second.Code, second.Body, first.Code, first.Body)
			}
		} else if second.Code != http.StatusUnprocessableEntity || !strings.Contains(second.Body.String(), idemhttp.CodeKeyMismatch) {
			t.Fatalf("bodies %q and %q: the second got %d %s, want 422 %s", body, other, second.Code, second.Body, idemhttp.CodeKeyMismatch)
		}
	})
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	r io.Reader
	n int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
