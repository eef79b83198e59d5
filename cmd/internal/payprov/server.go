package payprov

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config configures a Server. A nil *Config means the defaults.
type Config struct {
	// RefundLimitCents caps the total refunded of each payment that was not
	// registered with an amount through POST /_control/payments. The
	// default, 0, is no cap.
	RefundLimitCents int64
	// StatePath, when set, is a JSON file that holds the server's effects,
	// answers and payments: New reads it if it exists, and the server
	// rewrites it (a new file renamed over it) with each answer it stores
	// and each payment registered, before it answers, so a provider process that restarts keeps its refunds; a
	// failure to write is logged, and the answer sent all the same. Faults
	// are not kept. The default, "", keeps everything in memory only.
	StatePath string
	// Logger receives a line per performed effect and per failure to save
	// the state. The default, nil, discards.
	Logger *slog.Logger
}

// maxBody bounds a request body.
const maxBody = 64 << 10

// Server is the simulated payment provider, an http.Handler. Its zero
// value is not usable: make one with New, and Close it to end the
// requests its faults hold.
type Server struct {
	cfg    Config
	log    *slog.Logger
	mux    *http.ServeMux
	closed chan struct{}
	once   sync.Once

	mu     sync.Mutex
	st     *state
	faults []*queuedFault
}

// state is what the server knows; with StatePath set, it is the file's
// content.
type state struct {
	RefundLimitCents int64                `json:"-"`
	Keys             map[string]*keyEntry `json:"keys"`
	Effects          []Effect             `json:"effects"`
	Payments         map[string]Payment   `json:"payments"`
	Refunded         map[string]int64     `json:"refunded"`
}

// A keyEntry is the provider's memory of an idempotency key.
type keyEntry struct {
	Kind        Kind   `json:"kind"`
	Requests    int    `json:"requests"`
	State       string `json:"state,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Status and Body are the stored answer, set once State is done.
	Status int             `json:"status,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
}

// The states of a key: free (no answer stored, none being made), in
// progress, done (an answer stored).
const (
	keyFree       = ""
	keyInProgress = "in_progress"
	keyDone       = "done"
)

// New returns a Server configured by cfg, with the state of cfg.StatePath
// if that file exists.
func New(cfg *Config) (*Server, error) {
	s := &Server{closed: make(chan struct{}), st: &state{
		Keys: map[string]*keyEntry{}, Payments: map[string]Payment{}, Refunded: map[string]int64{},
	}}
	if cfg != nil {
		s.cfg = *cfg
	}
	if s.cfg.RefundLimitCents < 0 {
		return nil, fmt.Errorf("payprov: negative RefundLimitCents %d", s.cfg.RefundLimitCents)
	}
	s.log = s.cfg.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.StatePath != "" {
		if err := s.load(); err != nil {
			return nil, err
		}
	}
	s.st.RefundLimitCents = s.cfg.RefundLimitCents
	s.mux = http.NewServeMux()
	for _, res := range resources {
		s.mux.HandleFunc("POST "+res.path, func(w http.ResponseWriter, r *http.Request) { s.serveEffect(w, r, res) })
	}
	s.mux.HandleFunc("POST /_control/faults", s.addFault)
	s.mux.HandleFunc("GET /_control/faults", s.listFaults)
	s.mux.HandleFunc("DELETE /_control/faults", s.clearFaults)
	s.mux.HandleFunc("POST /_control/payments", s.registerPayment)
	s.mux.HandleFunc("GET /_control/{kind}", s.ledger)
	return s, nil
}

// ServeHTTP serves the provider's API and its control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close ends the requests that faults hold (hang, timeout_after_effect)
// and makes every later one end at once; they get no answer. The server
// still answers other requests. Close always returns nil.
func (s *Server) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// An answer is a status and a JSON body.
type answer struct {
	status int
	body   []byte
}

func errorAnswer(status int, code, message string) answer {
	body, _ := json.Marshal(errorBody{Error: errorDetail{Code: code, Message: message}})
	return answer{status, body}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (a answer) write(w http.ResponseWriter, replayed bool) {
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(a.status)
	w.Write(a.body)
}

// serveEffect is the idempotent core that every resource shares.
func (s *Server) serveEffect(w http.ResponseWriter, r *http.Request, res resource) {
	key := r.Header.Get("Idempotency-Key")
	if !validKey(key) {
		errorAnswer(http.StatusBadRequest, "idempotency_key_required",
			"an Idempotency-Key header of 1 to 255 bytes of UTF-8 text without control characters is required").write(w, false)
		return
	}
	s.count(key, res.kind)
	req, fp, err := decode(r, w, res)
	if err != nil {
		errorAnswer(http.StatusBadRequest, "invalid_request", err.Error()).write(w, false)
		return
	}
	f := s.takeFault(res.path)
	switch f.Mode {
	case FaultFail:
		errorAnswer(http.StatusInternalServerError, "provider_error", "injected failure: nothing was done").write(w, false)
		return
	case FaultHang:
		s.hang(r) // does not return
	}
	ans, started, replayed := s.begin(key, res.kind, fp)
	if f.Mode == FaultDelay && !s.sleep(r.Context(), time.Duration(f.DelayMS)*time.Millisecond) {
		if started {
			s.abandon(key)
		}
		panic(http.ErrAbortHandler)
	}
	if started {
		ans = s.perform(key, res, req, f.Mode == FaultRefuse)
	}
	if f.Mode == FaultTimeoutAfterEffect {
		s.hang(r)
	}
	ans.write(w, replayed)
}

// validKey reports whether key is 1 to 255 bytes of UTF-8 without control
// characters.
func validKey(key string) bool {
	if key == "" || len(key) > 255 || !utf8.ValidString(key) {
		return false
	}
	return !strings.ContainsFunc(key, unicode.IsControl)
}

// decode reads the body of r strictly (known members, one JSON value) into
// res's request, validates it, and returns it with its fingerprint: the
// resource and the request re-encoded, so that spacing and member order do
// not make two equal requests differ.
func decode(r *http.Request, w http.ResponseWriter, res resource) (effectRequest, string, error) {
	req := res.newReq()
	if err := readStrict(w, r, req); err != nil {
		return nil, "", err
	}
	if err := req.validate(); err != nil {
		return nil, "", err
	}
	canon, err := json.Marshal(req)
	if err != nil {
		return nil, "", err
	}
	return req, string(res.kind) + " " + string(canon), nil
}

// readStrict decodes the body of r, one JSON object with known members
// only and at most maxBody bytes, into v.
func readStrict(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not a valid request: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("the body holds more than one JSON value")
	}
	return nil
}

// count counts a request with key; the first one fixes the key's kind.
func (s *Server) count(key string, kind Kind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.st.Keys[key]
	if e == nil {
		e = &keyEntry{Kind: kind}
		s.st.Keys[key] = e
	}
	e.Requests++
}

// begin takes key for a request with fingerprint fp (started), or returns
// what to answer instead: the stored answer (replayed), 409 while another
// request holds the key, 422 when the key was used for another request.
func (s *Server) begin(key string, kind Kind, fp string) (ans answer, started, replayed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.st.Keys[key]
	switch {
	case e.State == keyInProgress:
		return errorAnswer(http.StatusConflict, "request_in_progress",
			"another request with this Idempotency-Key is in progress; retry later"), false, false
	case e.State == keyDone && e.Fingerprint != fp:
		return errorAnswer(http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this Idempotency-Key was used with another request"), false, false
	case e.State == keyDone:
		return answer{e.Status, e.Body}, false, true
	}
	e.State, e.Fingerprint, e.Kind = keyInProgress, fp, kind
	return answer{}, true, false
}

// abandon frees key, taken by a request that ends without an effect.
func (s *Server) abandon(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.st.Keys[key]
	e.State, e.Fingerprint = keyFree, ""
}

// perform makes the effect of req under key, or refuses it (always when
// refuse is set), and stores the answer under key.
func (s *Server) perform(key string, res resource, req effectRequest, refuse bool) answer {
	id := res.idPrefix + newID()
	now := time.Now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	var obj any
	refused := &RefusedError{Code: res.refusal, Message: "refused by an injected fault"}
	if !refuse {
		obj, refused = req.create(s.st, id, now)
	}
	var ans answer
	if refused != nil {
		ans = errorAnswer(http.StatusPaymentRequired, refused.Code, refused.Message)
		s.log.Info("payprov: refused", "kind", res.kind, "idempotency_key", key, "code", refused.Code)
	} else {
		body, _ := json.Marshal(obj)
		ans = answer{http.StatusCreated, body}
		s.st.Effects = append(s.st.Effects, Effect{Kind: res.kind, ID: id, IdempotencyKey: key, Object: body})
		s.log.Info("payprov: performed", "kind", res.kind, "idempotency_key", key, "id", id)
	}
	e := s.st.Keys[key]
	e.State, e.Status, e.Body = keyDone, ans.status, ans.body
	s.saveLocked()
	return ans
}

// hang holds a request until its client goes or the server closes, then
// drops its connection without an answer.
func (s *Server) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.closed:
	}
	panic(http.ErrAbortHandler)
}

// sleep waits d and reports whether it did, rather than seeing ctx end or
// the server close.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-s.closed:
	}
	return false
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// load reads the state file, if there is one.
func (s *Server) load() error {
	raw, err := os.ReadFile(s.cfg.StatePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("payprov: reading the state: %w", err)
	}
	if err := json.Unmarshal(raw, s.st); err != nil {
		return fmt.Errorf("payprov: reading the state %s: %w", filepath.Base(s.cfg.StatePath), err)
	}
	for key, e := range s.st.Keys {
		if e == nil {
			return fmt.Errorf("payprov: the state holds a null key %q", key)
		}
	}
	if s.st.Refunded == nil {
		s.st.Refunded = map[string]int64{}
	}
	if s.st.Keys == nil {
		s.st.Keys = map[string]*keyEntry{}
	}
	if s.st.Payments == nil {
		s.st.Payments = map[string]Payment{}
	}
	return nil
}

// saveLocked writes the state file, if the server has one, with s.mu held.
// Keys in progress are written free: their effect has not happened.
func (s *Server) saveLocked() {
	if s.cfg.StatePath == "" {
		return
	}
	snapshot := *s.st
	snapshot.Keys = make(map[string]*keyEntry, len(s.st.Keys))
	for key, e := range s.st.Keys {
		c := *e
		if c.State == keyInProgress {
			c.State, c.Fingerprint = keyFree, ""
		}
		snapshot.Keys[key] = &c
	}
	if err := writeFileAtomic(s.cfg.StatePath, &snapshot); err != nil {
		s.log.Error("payprov: saving the state", "err", err)
	}
}

func writeFileAtomic(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(raw)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
