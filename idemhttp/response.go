package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/idemkit/idem"
)

// Header names the middleware reads and writes.
const (
	// HeaderIdempotencyKey is the request header that carries the key.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed ("true") marks a response replayed from a record.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted ("true") marks a replayed response whose body was
	// not kept (too large, or streamed past the limit): the status and
	// headers are the original's, the body is empty.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// Problem codes: the "code" member of the middleware's problem+json
// answers. They are stable; see the package documentation for when each is
// sent.
const (
	CodeMissingKey       = "MISSING_KEY"       // 400
	CodeInvalidKey       = "INVALID_KEY"       // 400
	CodeInvalidScope     = "INVALID_SCOPE"     // 400
	CodeInvalidRequest   = "INVALID_REQUEST"   // 400
	CodeUnauthenticated  = "UNAUTHENTICATED"   // 401
	CodeKeyMismatch      = "KEY_MISMATCH"      // 422
	CodeProcessing       = "PROCESSING"        // 409
	CodeBodyTooLarge     = "BODY_TOO_LARGE"    // 413
	CodeStoreUnavailable = "STORE_UNAVAILABLE" // 503
	CodeSpoolUnavailable = "SPOOL_UNAVAILABLE" // 503
)

// problemTypeBase + lower-case code is the "type" URI of the middleware's
// own problems: a page that says what the code means and what to do.
const problemTypeBase = "https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#"

// JSONResponse returns a Response with status, Content-Type
// application/json and v encoded by encoding/json (no trailing newline).
// Its Header map is never nil, so a handler may add headers (Location) to
// it before completing with it. Use it with Execution.CompleteTx, then
// WriteResponse.
func JSONResponse(status int, v any) (idem.Response, error) {
	if status < 100 || status > 999 {
		return idem.Response{}, fmt.Errorf("idemhttp: JSONResponse: invalid status %d", status)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return idem.Response{}, fmt.Errorf("idemhttp: JSONResponse: %w", err)
	}
	return idem.Response{
		StatusCode: status,
		Header:     map[string][]string{"Content-Type": {"application/json"}},
		Body:       body,
	}, nil
}

// WriteResponse writes resp to w: its headers (added to those already set,
// replacing equal names), its status (0 means 200) and its body. A response
// whose body was omitted is written without a body, without Content-Length
// and with Idempotent-Body-Omitted: true. WriteResponse does not add
// Idempotent-Replayed; the middleware does when it replays.
func WriteResponse(w http.ResponseWriter, resp idem.Response) {
	h := w.Header()
	for name, values := range resp.Header {
		// Clip: an Add on w's header must never append into resp's memory.
		h[name] = slices.Clip(values)
	}
	if resp.BodyOmitted {
		h[HeaderBodyOmitted] = []string{"true"}
		delete(h, "Content-Length")
	}
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if len(resp.Body) > 0 && !resp.BodyOmitted {
		_, _ = w.Write(resp.Body)
	}
}

// WriteProblem writes an RFC 9457 application/problem+json answer with the
// members type, title, status, detail and code. For the middleware's own
// codes (the Code constants) type is a URI that documents the code; for
// any other code it is "about:blank". An empty title means the status's
// text (http.StatusText); an empty detail or code is left out. It sets
// Content-Type and removes a Content-Length set before; set other headers
// (Retry-After) on w before calling it.
func WriteProblem(w http.ResponseWriter, status int, code, title, detail string) {
	if title == "" {
		title = http.StatusText(status)
	}
	b := make([]byte, 0, 160+len(title)+len(detail)+len(code))
	b = append(b, `{"type":`...)
	if t, ok := problemType(code); ok {
		b = append(b, '"')
		b = append(b, problemTypeBase...)
		b = append(b, t...)
		b = append(b, '"')
	} else {
		b = append(b, `"about:blank"`...)
	}
	b = append(b, `,"title":`...)
	b = appendJSONString(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	if detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, detail)
	}
	if code != "" {
		b = append(b, `,"code":`...)
		b = appendJSONString(b, code)
	}
	b = append(b, '}')

	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	delete(h, "Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// problemType returns the fragment of the documentation of one of the
// middleware's own codes.
func problemType(code string) (string, bool) {
	switch code {
	case CodeMissingKey:
		return "missing_key", true
	case CodeInvalidKey:
		return "invalid_key", true
	case CodeInvalidScope:
		return "invalid_scope", true
	case CodeInvalidRequest:
		return "invalid_request", true
	case CodeUnauthenticated:
		return "unauthenticated", true
	case CodeKeyMismatch:
		return "key_mismatch", true
	case CodeProcessing:
		return "processing", true
	case CodeBodyTooLarge:
		return "body_too_large", true
	case CodeStoreUnavailable:
		return "store_unavailable", true
	case CodeSpoolUnavailable:
		return "spool_unavailable", true
	}
	return "", false
}
