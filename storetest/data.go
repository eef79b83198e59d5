package storetest

import (
	"crypto/rand"
	"fmt"

	"github.com/idemkit/idem"
)

// roundTrip completes a new key with resp and checks that Get and a replay
// by Acquire return it byte for byte.
func (h *harness) roundTrip(key string, resp idem.Response) {
	h.Helper()
	req := h.req(key, "fp", longLease)
	l := h.lease(req)
	h.complete(l, resp)
	h.checkCompleted(h.get(key), "fp", l, resp, longRetention)
	res := h.expect(req, idem.Completed)
	if d := diffResponse(res.Record.Response, resp); d != "" {
		h.Fatalf("replayed response of %q: %s", key, d)
	}
}

var dataCases = []testCase{
	{name: "BodyBinary", run: func(h *harness) {
		all := make([]byte, 0, 512)
		for i := range 256 {
			all = append(all, byte(i))
		}
		for i := range 256 {
			all = append(all, byte(255-i))
		}
		bodies := map[string][]byte{
			"all-bytes":   all,
			"nul":         {0},
			"nuls":        make([]byte, 100),
			"nul-inside":  []byte("a\x00b\x00\x00c"),
			"bad-utf8":    {0xff, 0xfe, 0xc3, 0x28, 0xe2, 0x82},
			"trailing-ws": []byte("x \n\t\r\n "),
			"json":        []byte(`{"a":"\u0000","b":[1,2]}`),
		}
		for name, body := range bodies {
			h.roundTrip(name, idem.Response{StatusCode: 200, Body: body})
		}
	}},

	{name: "BodyLarge", run: func(h *harness) {
		body := make([]byte, 1<<20)
		_, _ = rand.Read(body)
		h.roundTrip("k", idem.Response{StatusCode: 200, Header: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body})
	}},

	{name: "BodyNilAndEmpty", run: func(h *harness) {
		// Nil and empty are the same: both come back with no bytes.
		h.roundTrip("nil", idem.Response{StatusCode: 204})
		h.roundTrip("empty", idem.Response{StatusCode: 204, Body: []byte{}, Header: map[string][]string{}})
	}},

	{name: "BodyOmitted", run: func(h *harness) {
		h.roundTrip("omitted", idem.Response{StatusCode: 200, Header: map[string][]string{"Content-Type": {"video/mp4"}}, BodyOmitted: true})
		h.roundTrip("kept", idem.Response{StatusCode: 200, Body: []byte("small"), BodyOmitted: false})
	}},

	{name: "Headers", run: func(h *harness) {
		h.roundTrip("multi", idem.Response{StatusCode: 201, Header: map[string][]string{
			"Content-Type":     {"application/json; charset=utf-8"},
			"Link":             {"</a>; rel=next", "</b>; rel=prev", "</c>; rel=last"}, // order matters
			"X-Empty":          {""},
			"X-Unicode":        {"ключ-🔑", `quote " and \ backslash`},
			"Content-Location": {"/orders/1"},
		}})
		many := map[string][]string{}
		for i := range 50 {
			many[fmt.Sprintf("X-H%02d", i)] = []string{fmt.Sprint(i), fmt.Sprint(i * i)}
		}
		h.roundTrip("many", idem.Response{StatusCode: 200, Header: many})
	}},

	{name: "HeaderBytes", run: func(h *harness) {
		// Header values are kept byte for byte, whatever the bytes: not
		// valid UTF-8, NUL and other control bytes, empty. (Names are
		// canonical header names in practice; values come from handlers.)
		h.roundTrip("odd", idem.Response{StatusCode: 200, Header: map[string][]string{
			"X-Bad-Utf8": {"a\xffb", "\x80", "\xc3\x28", "\xe2\x82", "\xed\xa0\x80"},
			"X-Empty":    {"", "", "x"},
			"X-Nul":      {"\x00", "a\x00b", "\x00\x00"},
			"X-Control":  {"\x01\x1f\x7f\t\r\n", "\u2028\u2029", "\ufffd"},
			"X-Json":     {`{"a":"\u0000"}`, `\"`, `\\`, "<&>"},
		}, Body: []byte("a\xffb\x00\x80")})
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		h.roundTrip("all-bytes", idem.Response{StatusCode: 201, Header: map[string][]string{"X-All": {string(all), string(all[128:])}}, Body: all})
	}},

	{name: "StatusCodes", run: func(h *harness) {
		for _, code := range []int{0, 200, 201, 202, 204, 301, 404, 409, 422, 599, 1000, -1} {
			h.roundTrip(fmt.Sprintf("code-%d", code), idem.Response{StatusCode: code})
		}
	}},

	{name: "ResponseIsolated", run: func(h *harness) {
		// The store keeps what Complete was given, not the caller's
		// memory, and hands out copies.
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		resp := idem.Response{StatusCode: 200, Header: map[string][]string{"X-A": {"1", "2"}}, Body: []byte("original")}
		want := idem.Response{StatusCode: 200, Header: map[string][]string{"X-A": {"1", "2"}}, Body: []byte("original")}
		h.complete(l, resp)
		resp.Body[0] = 'X'
		resp.Header["X-A"][0] = "mutated"
		resp.Header["X-B"] = []string{"added"}
		h.checkCompleted(h.get("k"), "fp", l, want, longRetention)

		got := h.get("k")
		got.Response.Body[0] = 'Y'
		got.Response.Header["X-A"][1] = "mutated"
		got.Response.Header["X-C"] = []string{"added"}
		got.Response.StatusCode = 500
		replay := h.expect(req, idem.Completed)
		replay.Record.Response.Body[1] = 'Z'
		replay.Record.Response.Header["X-A"][0] = "mutated"
		h.checkCompleted(h.get("k"), "fp", l, want, longRetention)
	}},
}
