package payprov

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// FaultMode is what an injected fault does to a request.
type FaultMode string

// The fault modes.
const (
	// FaultFail answers 500 and performs nothing; nothing is stored under
	// the key, so a retry with it performs the effect.
	FaultFail FaultMode = "fail"
	// FaultHang answers nothing and performs nothing until the client
	// goes or the server closes, then drops the connection.
	FaultHang FaultMode = "hang"
	// FaultTimeoutAfterEffect performs the effect and stores its answer,
	// then hangs as FaultHang does: the caller cannot tell that it
	// happened, and a retry with the key gets the stored answer.
	FaultTimeoutAfterEffect FaultMode = "timeout_after_effect"
	// FaultRefuse refuses the effect (402) and stores the refusal under
	// the key as a real refusal is. A key with a stored answer replays it.
	FaultRefuse FaultMode = "refuse"
	// FaultDelay waits DelayMS before the effect (holding the key, so a
	// concurrent request with it gets 409) or before a replay.
	FaultDelay FaultMode = "delay"
)

// Fault is the body of POST /_control/faults: the next Count requests to
// Path (every resource path when empty; all later ones when Count is 0)
// get Mode.
type Fault struct {
	Path    string    `json:"path,omitempty"`
	Mode    FaultMode `json:"mode"`
	Count   int       `json:"count,omitempty"`
	DelayMS int       `json:"delay_ms,omitempty"`
}

func (f *Fault) validate() error {
	switch f.Mode {
	case FaultFail, FaultHang, FaultTimeoutAfterEffect, FaultRefuse, FaultDelay:
	default:
		return fmt.Errorf("unknown fault mode %q", f.Mode)
	}
	if f.Path != "" && !slices.ContainsFunc(resources, func(r resource) bool { return r.path == f.Path }) {
		return fmt.Errorf("no resource has the path %q", f.Path)
	}
	if f.Count < 0 || f.DelayMS < 0 {
		return fmt.Errorf("count and delay_ms must not be negative")
	}
	return nil
}

// A queuedFault is a Fault with the requests it has left (Count counts
// down; forever when it was 0).
type queuedFault struct {
	Fault
	forever bool
}

// takeFault returns the fault that the next request to path gets, the
// first queued one that matches, and counts it down; the zero Fault when
// none matches.
func (s *Server) takeFault(path string) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.faults {
		if q.Path != "" && q.Path != path {
			continue
		}
		f := q.Fault
		if !q.forever {
			q.Count--
			if q.Count == 0 {
				s.faults = slices.Delete(s.faults, i, i+1)
			}
		}
		return f
	}
	return Fault{}
}

// addFault serves POST /_control/faults: it queues a fault after those
// queued already.
func (s *Server) addFault(w http.ResponseWriter, r *http.Request) {
	var f Fault
	if !decodeControl(w, r, &f) {
		return
	}
	if err := f.validate(); err != nil {
		errorAnswer(http.StatusBadRequest, "invalid_request", err.Error()).write(w, false)
		return
	}
	s.mu.Lock()
	s.faults = append(s.faults, &queuedFault{Fault: f, forever: f.Count == 0})
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// listFaults serves GET /_control/faults: the queued faults, each with the
// requests it has left in count.
func (s *Server) listFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := struct {
		Faults []Fault `json:"faults"`
	}{Faults: []Fault{}}
	for _, q := range s.faults {
		list.Faults = append(list.Faults, q.Fault)
	}
	s.mu.Unlock()
	writeJSON(w, list)
}

// clearFaults serves DELETE /_control/faults.
func (s *Server) clearFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Payment is the body of POST /_control/payments: a payment the provider
// knows, which limits its refunds. Refunds of it may total AmountCents
// (when 0, the server's RefundLimitCents); none is made when
// NonRefundable is set. Registering a payment again replaces it.
type Payment struct {
	Payment       string `json:"payment"`
	AmountCents   int64  `json:"amount_cents,omitempty"`
	NonRefundable bool   `json:"non_refundable,omitempty"`
}

// registerPayment serves POST /_control/payments.
func (s *Server) registerPayment(w http.ResponseWriter, r *http.Request) {
	var p Payment
	if !decodeControl(w, r, &p) {
		return
	}
	if p.Payment == "" || p.AmountCents < 0 {
		errorAnswer(http.StatusBadRequest, "invalid_request", "payment is required and amount_cents must not be negative").write(w, false)
		return
	}
	s.mu.Lock()
	s.st.Payments[p.Payment] = p
	s.saveLocked()
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Effect is an effect the provider performed: a refund, a charge or a
// shipment, made once under IdempotencyKey. Object is the resource's JSON
// (a Refund, a Charge, a Shipment).
type Effect struct {
	Kind           Kind            `json:"kind"`
	ID             string          `json:"id"`
	IdempotencyKey string          `json:"idempotency_key"`
	Object         json.RawMessage `json:"object"`
}

// KeyState is what the provider knows of an idempotency key: the requests
// that came with it and, in State, "" (no answer stored: every request
// failed, hung, or had a malformed body), "in_progress" or "done" (the
// answer, of Status, is stored).
type KeyState struct {
	IdempotencyKey string `json:"idempotency_key"`
	Requests       int    `json:"requests"`
	State          string `json:"state"`
	Status         int    `json:"status,omitempty"`
}

// Ledger is the answer of GET /_control/{kind}: the effects of that kind
// in the order they were performed, and the keys used with it (those
// whose answer is of that kind, else whose first request was), sorted.
type Ledger struct {
	Effects []Effect   `json:"effects"`
	Keys    []KeyState `json:"keys"`
}

// ledger serves GET /_control/{kind}.
func (s *Server) ledger(w http.ResponseWriter, r *http.Request) {
	res, ok := resourceOf(Kind(r.PathValue("kind")))
	if !ok {
		errorAnswer(http.StatusNotFound, "not_found", "no such resource").write(w, false)
		return
	}
	l := Ledger{Effects: []Effect{}, Keys: []KeyState{}}
	s.mu.Lock()
	for _, e := range s.st.Effects {
		if e.Kind == res.kind {
			l.Effects = append(l.Effects, e)
		}
	}
	for key, e := range s.st.Keys {
		if e.Kind == res.kind {
			l.Keys = append(l.Keys, KeyState{IdempotencyKey: key, Requests: e.Requests, State: e.State, Status: e.Status})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(l.Keys, func(a, b KeyState) int { return strings.Compare(a.IdempotencyKey, b.IdempotencyKey) })
	writeJSON(w, l)
}

// decodeControl decodes the body of a control request into v, or answers
// 400 and reports false.
func decodeControl(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := readStrict(w, r, v); err != nil {
		errorAnswer(http.StatusBadRequest, "invalid_request", err.Error()).write(w, false)
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		errorAnswer(http.StatusInternalServerError, "provider_error", err.Error()).write(w, false)
		return
	}
	answer{http.StatusOK, body}.write(w, false)
}
