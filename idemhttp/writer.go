package idemhttp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
)

// errWriteAfterReturn answers a Write on the recorder after the handler
// returned (a handler bug that net/http also forbids).
var errWriteAfterReturn = errors.New("idemhttp: Write after the handler returned")

// recorder is the ResponseWriter a guarded handler writes to. It holds the
// response back until the handler returns, so that the record can be
// completed or released before the client sees the answer, and keeps a
// copy of the body for the record. When the body outgrows the limit, or
// the handler flushes or hijacks, the response goes out as it is written
// from then on ("forwarded"); the record keeps the body only if it stays
// within the limit.
type recorder struct {
	w      http.ResponseWriter
	m      *Middleware
	ctx    context.Context // the execution's
	status int             // the final status the handler wrote; 0 until then
	buf    []byte          // the body: held back, then (once forwarded) the copy kept
	late   http.Header
	header map[string][]string // the header as sent, once forwarded or hijacked

	prepared  bool // Content-Type sniffed
	forwarded bool // the status line went to w
	omitted   bool // the body outgrew the limit: buf is not the body
	hijacked  bool
	done      bool // the handler returned
}

var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ http.Flusher        = (*recorder)(nil)
	_ http.Hijacker       = (*recorder)(nil)
)

// Header returns the response's header map. As with net/http, changes made
// after WriteHeader are not sent (except trailers).
func (r *recorder) Header() http.Header {
	if r.status != 0 && !r.forwarded {
		if r.late == nil {
			r.late = r.w.Header().Clone()
		}
		return r.late
	}
	return r.w.Header()
}

// WriteHeader records the status. Informational statuses (1xx other than
// 101) go to the client at once, as net/http sends them.
func (r *recorder) WriteHeader(code int) {
	if r.hijacked || r.done || r.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code)) // as net/http does
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		r.w.WriteHeader(code)
		return
	}
	r.status = code
}

// Write holds p back (and keeps it for the record), or sends it when the
// response is forwarded.
func (r *recorder) Write(p []byte) (int, error) {
	switch {
	case r.done:
		return 0, errWriteAfterReturn
	case r.hijacked:
		return 0, http.ErrHijacked
	}
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !bodyAllowedForStatus(r.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if r.forwarded {
		r.keep(p)
		return r.w.Write(p)
	}
	if int64(len(r.buf))+int64(len(p)) <= r.m.maxResp {
		r.buf = append(r.buf, p...)
		return len(p), nil
	}
	// Too large to keep: send what is held back, then stream.
	if err := r.forward(); err != nil {
		return 0, err
	}
	r.keep(p)
	return r.w.Write(p)
}

// keep adds p to the kept copy of a forwarded body, or gives the copy up
// when it outgrows the limit.
func (r *recorder) keep(p []byte) {
	if r.omitted {
		return
	}
	if int64(len(r.buf))+int64(len(p)) > r.m.maxResp {
		r.omitted = true
		r.buf = r.buf[:0]
		return
	}
	r.buf = append(r.buf, p...)
}

// errLeaseLost answers a Flush or Hijack that would start the response of
// an execution whose lease was lost.
var errLeaseLost = fmt.Errorf("idemhttp: response held back: %w", idem.ErrLeaseLost)

// leaseLost reports whether the execution's context ended for a lost
// lease: nothing of its response may start going out then, since another
// execution may hold the key and the client is to get what a retry gets.
func (r *recorder) leaseLost() bool {
	return r.ctx != nil && r.ctx.Err() != nil && errors.Is(context.Cause(r.ctx), idem.ErrLeaseLost)
}

// FlushError sends the status, headers and body written so far, and
// streams the rest of the response. The record still keeps the body if it
// stays within MaxResponseBody. Once the execution's context says its
// lease was lost, a response that has not started stays held back: the
// flush fails with an error matching idem.ErrLeaseLost.
func (r *recorder) FlushError() error {
	switch {
	case r.done:
		return errWriteAfterReturn
	case r.hijacked:
		return http.ErrHijacked
	case !r.forwarded && r.leaseLost():
		return errLeaseLost
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if err := r.forward(); err != nil {
		return err
	}
	return http.NewResponseController(r.w).Flush()
}

// Flush is FlushError without the error.
func (r *recorder) Flush() { _ = r.FlushError() }

// Hijack sends what was written so far (if WriteHeader was called, as
// net/http does) and hands the connection over. The record then completes
// with the status written before (200 if none), the replayable headers and
// no body (BodyOmitted), unless the release policy releases that status.
// Once the execution's context says its lease was lost, it fails with an
// error matching idem.ErrLeaseLost (unless the response has started).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	switch {
	case r.done:
		return nil, nil, errWriteAfterReturn
	case r.hijacked:
		return nil, nil, http.ErrHijacked
	case !r.forwarded && r.leaseLost():
		return nil, nil, errLeaseLost
	}
	if r.status != 0 {
		if err := r.forward(); err != nil {
			return nil, nil, err
		}
	}
	conn, brw, err := http.NewResponseController(r.w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if !r.forwarded {
		r.prepare()
		r.header = maps.Clone(r.w.Header())
	}
	r.hijacked = true
	r.omitted = true
	r.buf = r.buf[:0]
	return conn, brw, nil
}

// Unwrap returns the underlying ResponseWriter, for http.ResponseController
// (deadlines, full duplex).
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// finalStatus is the status the client gets: 200 if the handler wrote
// nothing.
func (r *recorder) finalStatus() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// prepare fixes the header the client gets: it sniffs the Content-Type as
// net/http would, so that the record and the client agree on it.
func (r *recorder) prepare() {
	if r.prepared {
		return
	}
	r.prepared = true
	h := r.w.Header()
	status := r.finalStatus()
	if len(r.buf) > 0 && bodyAllowedForStatus(status) {
		_, haveType := h["Content-Type"]
		if !haveType && h.Get("Content-Encoding") == "" && h.Get("Transfer-Encoding") == "" {
			h["Content-Type"] = []string{http.DetectContentType(r.buf)}
		}
	}
}

// forward sends the status line, the header and the body held back, once;
// it keeps the header as sent for the record, since the handler may still
// change the map.
func (r *recorder) forward() error {
	if r.forwarded {
		return nil
	}
	r.prepare()
	r.header = maps.Clone(r.w.Header())
	r.forwarded = true
	r.w.WriteHeader(r.finalStatus())
	if len(r.buf) > 0 {
		if _, err := r.w.Write(r.buf); err != nil {
			return err
		}
	}
	return nil
}

// response returns the handler's response as the client gets it. The
// guard passes it through Middleware.storable before it is stored, which
// keeps only the replayable headers (the recorder does not filter them
// itself). Its header map is the writer's, or the copy made when the
// response was forwarded.
func (r *recorder) response() idem.Response {
	resp := idem.Response{StatusCode: r.finalStatus(), Header: r.finalHeader(), BodyOmitted: r.omitted}
	if !r.omitted && len(r.buf) > 0 {
		// buf goes back to a pool once the request ends; stores do not
		// retain a response after Complete returns (idem.Store).
		resp.Body = r.buf
	}
	return resp
}

// finalHeader is the header of the handler's response as the client gets
// it: the writer's, or the copy made when the response was forwarded.
func (r *recorder) finalHeader() http.Header {
	r.prepare()
	if !r.forwarded && !r.hijacked {
		return r.w.Header()
	}
	return r.header
}

// send sends the handler's response to the client.
func (r *recorder) send() {
	if !r.hijacked {
		_ = r.forward()
		r.copyTrailers()
	}
}

// sendCommitted sends the response the handler committed with CompleteTx,
// which replays will serve, in place of what it wrote: status, replayable
// headers and body come from resp; the non-replayable headers the handler
// set (Set-Cookie) stay. A response already forwarded cannot change.
func (r *recorder) sendCommitted(resp idem.Response) {
	if r.hijacked {
		return
	}
	if r.forwarded {
		r.copyTrailers()
		return
	}
	h := r.w.Header()
	for name := range h {
		if r.m.replayable(name) {
			delete(h, name)
		}
	}
	delete(h, "Content-Length")
	for name, values := range resp.Header {
		h[name] = slices.Clip(values)
	}
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	body := resp.Body
	if resp.BodyOmitted {
		body = r.buf // the record kept no body; the client gets the handler's
	}
	r.forwarded = true
	r.w.WriteHeader(status)
	if len(body) > 0 && bodyAllowedForStatus(status) {
		_, _ = r.w.Write(body)
	}
	r.copyTrailers()
}

// discard drops the handler's response, none of which has reached the
// client, so that another can be written to r.w: the header goes back to
// before, what it held before the handler ran.
func (r *recorder) discard(before http.Header) {
	h := r.w.Header()
	clear(h)
	maps.Copy(h, before)
	r.late = nil
	r.forwarded = true // nothing more goes out from the recorder
}

// copyTrailers moves trailers set on the late header copy to the real
// header, where net/http reads them when the handler is done.
func (r *recorder) copyTrailers() {
	if r.late == nil {
		return
	}
	h := r.w.Header()
	declared := h["Trailer"]
	for name, values := range r.late {
		if strings.HasPrefix(name, http.TrailerPrefix) || isDeclaredTrailer(declared, name) {
			h[name] = values
		}
	}
}

func isDeclaredTrailer(declared []string, name string) bool {
	for _, v := range declared {
		for field := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(field), name) {
				return true
			}
		}
	}
	return false
}

// replayable reports whether a response header is stored and replayed.
func (m *Middleware) replayable(name string) bool {
	for _, allowed := range m.replayHeaders {
		if len(allowed) == len(name) && strings.EqualFold(allowed, name) {
			return true
		}
	}
	return false
}

func bodyAllowedForStatus(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}
