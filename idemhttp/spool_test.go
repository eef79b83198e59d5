package idemhttp_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/memstore"
)

// uploadPattern is the period of the bodies patternBody generates: a prime
// number of random bytes, so that no chunk boundary lines up with it.
var uploadPattern = func() []byte {
	b := make([]byte, 65521)
	rng := rand.NewChaCha8([32]byte{'i', 'd', 'e', 'm'})
	_, _ = rng.Read(b)
	return b
}()

// patternBody is a request body of n bytes generated as it is read, never
// held in memory: uploadPattern repeated, with the byte at flip (if not
// negative) changed.
type patternBody struct {
	n, off, flip int64
}

func newPatternBody(n, flip int64) *patternBody { return &patternBody{n: n, flip: flip} }

func (b *patternBody) Read(p []byte) (int, error) {
	if b.off >= b.n {
		return 0, io.EOF
	}
	if rem := b.n - b.off; int64(len(p)) > rem {
		p = p[:rem]
	}
	for i := 0; i < len(p); {
		i += copy(p[i:], uploadPattern[(b.off+int64(i))%int64(len(uploadPattern)):])
	}
	if b.flip >= b.off && b.flip < b.off+int64(len(p)) {
		p[b.flip-b.off] ^= 0xff
	}
	b.off += int64(len(p))
	return len(p), nil
}

// patternSum is the SHA-256 of newPatternBody(n, flip)'s bytes.
func patternSum(n, flip int64) [sha256.Size]byte {
	h := sha256.New()
	_, _ = io.Copy(h, newPatternBody(n, flip))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// uploadHandler reads the body as a handler of uploads would: counting
// the bytes it reads and hashing them, then answering 201.
type uploadHandler struct {
	runs, read atomic.Int64
	mu         sync.Mutex
	sums       [][sha256.Size]byte
	onRun      func(r *http.Request) // if set, called before the body is read
}

func (h *uploadHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	if h.onRun != nil {
		h.onRun(r)
	}
	sum := sha256.New()
	n, err := io.Copy(sum, r.Body)
	h.read.Add(n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var s [sha256.Size]byte
	sum.Sum(s[:0])
	h.mu.Lock()
	h.sums = append(h.sums, s)
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"size":%d,"sha256":"%x"}`, n, s)
}

// uploadRequest is a POST /uploads with key and body; size is its
// Content-Length, or -1 for a body of unknown length (chunked).
func uploadRequest(key string, body io.Reader, size int64) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/uploads", body)
	r.Header.Set("Content-Type", "application/octet-stream")
	r.Header.Set(idemhttp.HeaderIdempotencyKey, key)
	r.ContentLength = size
	return r
}

// spoolSetup returns a store, a spool directory of the test's own and a
// Middleware that spools into it, configured further by fn.
func spoolSetup(t *testing.T, fn func(*idemhttp.Config)) (idem.Store, string, *idemhttp.Middleware) {
	t.Helper()
	store := memstore.New(nil)
	dir := t.TempDir()
	cfg := &idemhttp.Config{Store: store, SpoolBody: true, SpoolDir: dir}
	if fn != nil {
		fn(cfg)
	}
	m, err := idemhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store, dir, m
}

// spoolLeftovers reports the files in the spool directory dir, and (on
// Linux) this process's descriptors still open on a file that was in it:
// both must be none once a request has ended.
func spoolLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, "file "+e.Name())
	}
	for _, fd := range openSpools(t, dir) {
		left = append(left, "descriptor "+fd)
	}
	return left
}

// openSpools returns the targets of this process's open descriptors on
// files in dir (Linux only: /proc/self/fd; nil elsewhere).
func openSpools(t *testing.T, dir string) []string {
	t.Helper()
	if runtime.GOOS != "linux" {
		return nil
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open descriptors: %v", err)
	}
	var open []string
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(target, real+string(filepath.Separator)) {
			open = append(open, target)
		}
	}
	return open
}

// heapObjects is runtime/metrics' count of bytes in live and unswept heap
// objects.
const heapObjects = "/memory/classes/heap/objects:bytes"

// heapPeak samples heapObjects every 200 µs from start until stop is
// called, which returns the highest sample.
func heapPeak() (stop func() uint64) {
	done := make(chan struct{})
	result := make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: heapObjects}}
		var peak uint64
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				result <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-result
	}
}

// TestSpoolUpload100MiB sends a 100 MiB upload through a middleware with
// SpoolBody on memstore. The handler reads every byte once, in order; the
// middleware allocates (in total, so at most at its peak) less than
// 16 MiB for it; a retry of the same bytes (sent without Content-Length,
// so fingerprinted in a second pass) replays without running the handler;
// a retry with one byte changed is answered 422 without running it; and
// no spool file, nor a descriptor on one, is left after any of them.
func TestSpoolUpload100MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 300 MiB")
	}
	const size = 100 << 20
	const memLimit = 16 << 20
	store, dir, m := spoolSetup(t, func(c *idemhttp.Config) { c.MaxStreamedBody = 128 << 20 })
	h := &uploadHandler{}
	var spooled atomic.Bool
	h.onRun = func(r *http.Request) {
		if r.ContentLength != size {
			t.Errorf("the handler's request has ContentLength %d, want %d", r.ContentLength, size)
		}
		// The body is spooled in dir, unlinked while open.
		if runtime.GOOS != "linux" {
			spooled.Store(true)
			return
		}
		for _, target := range openSpools(t, dir) {
			if strings.HasSuffix(target, " (deleted)") {
				spooled.Store(true)
			}
		}
	}
	handler := m.Handler(h)
	want := patternSum(size, -1)

	// The first upload, its memory measured.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	base := []metrics.Sample{{Name: heapObjects}}
	metrics.Read(base)
	stop := heapPeak()
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, uploadRequest("upload-1", newPatternBody(size, -1), size))
	peak := stop()
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	growth := int64(peak) - int64(base[0].Value.Uint64())
	t.Logf("100 MiB upload: allocated %.2f MiB in total; heap peak %+.2f MiB over the baseline",
		float64(allocated)/(1<<20), float64(growth)/(1<<20))
	if allocated > memLimit {
		t.Errorf("the upload allocated %d bytes, want at most %d", allocated, memLimit)
	}
	if growth > memLimit {
		t.Errorf("the heap grew by %d bytes during the upload, want at most %d", growth, memLimit)
	}
	if w.Code != http.StatusCreated {
		t.Fatalf("first upload: %d %s", w.Code, w.Body)
	}
	if !spooled.Load() {
		t.Error("the handler ran without a spool file open in SpoolDir")
	}
	if got := h.read.Load(); got != size {
		t.Errorf("the handler read %d bytes, want %d", got, size)
	}
	if len(h.sums) != 1 || h.sums[0] != want {
		t.Errorf("the handler read other bytes than were sent (%d sums)", len(h.sums))
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("after the first upload: %v", left)
	}
	rec, err := store.Get(t.Context(), "", "upload-1")
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("record after the first upload: %+v, %v", rec, err)
	}

	// The same bytes, without Content-Length: replayed.
	w = httptest.NewRecorder()
	handler.ServeHTTP(w, uploadRequest("upload-1", newPatternBody(size, -1), -1))
	if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("retry: %d %v %s, want a replayed 201", w.Code, w.Header(), w.Body)
	}
	if want := fmt.Sprintf(`{"size":%d,"sha256":"%x"}`, size, want); w.Body.String() != want {
		t.Errorf("retry: body %s, want %s", w.Body, want)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("after the retry the handler ran %d times, want 1", runs)
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("after the retry: %v", left)
	}

	// One byte changed, near the end: 422, the handler does not run.
	w = httptest.NewRecorder()
	handler.ServeHTTP(w, uploadRequest("upload-1", newPatternBody(size, size-12345), size))
	wantProblem(t, w, http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("after a changed retry the handler ran %d times, want 1", runs)
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("after the changed retry: %v", left)
	}
	if got := h.read.Load(); got != size {
		t.Errorf("the handler read %d bytes in all, want %d", got, size)
	}
}

// TestSpoolFingerprintUnchanged: a spooled body has the fingerprint
// FingerprintV1 gives the same request in memory whenever FingerprintV1
// hashes the body as raw bytes, with or without Content-Length; a JSON
// body within MaxRequestBody is still fingerprinted in canonical form,
// and a JSON body over it is fingerprinted as raw bytes (as FingerprintV1
// fingerprints the same bytes under a non-JSON Content-Type).
func TestSpoolFingerprintUnchanged(t *testing.T) {
	t.Parallel()
	const memLimit = 64 << 10
	raw := make([]byte, 1<<20+123)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(raw)
	var big bytes.Buffer
	big.WriteString(`{"items":[`)
	for i := 0; big.Len() < 200<<10; i++ {
		if i > 0 {
			big.WriteByte(',')
		}
		fmt.Fprintf(&big, `{"sku":"S-%d", "qty": %d}`, i, i%7)
	}
	big.WriteString("]}")
	small := []byte(`{"b": 2, "a": [1, 2.50, "x"]}`)

	for _, tc := range []struct {
		name, path, contentType string
		body                    []byte
		chunked                 bool
		sameAs                  string // Content-Type of the in-memory request with the same fingerprint
	}{
		{name: "raw", path: "/uploads", contentType: "application/octet-stream", body: raw},
		{name: "raw chunked", path: "/uploads", contentType: "application/octet-stream", body: raw, chunked: true},
		{name: "text with query", path: "/uploads?b=2&a=1&a=0", contentType: "text/plain", body: raw},
		{name: "form", path: "/uploads", contentType: "application/x-www-form-urlencoded", body: bytes.Repeat([]byte("a=1&"), 50<<10)},
		{name: "invalid JSON", path: "/uploads", contentType: "application/json", body: raw},
		{name: "small JSON, canonical", path: "/uploads", contentType: "application/json", body: small},
		{name: "large JSON, raw", path: "/uploads", contentType: "application/json", body: big.Bytes(), sameAs: "application/octet-stream"},
		{name: "large JSON chunked, raw", path: "/uploads", contentType: "application/vnd.api+json", body: big.Bytes(), chunked: true, sameAs: "text/plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store, dir, m := spoolSetup(t, func(c *idemhttp.Config) { c.MaxRequestBody = memLimit })
			var seen []byte
			handler := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen, _ = io.ReadAll(r.Body)
				w.WriteHeader(http.StatusCreated)
			}))
			newReq := func(contentType string) *http.Request {
				r := httptest.NewRequest(http.MethodPost, tc.path, bytes.NewReader(tc.body))
				r.Header.Set("Content-Type", contentType)
				r.Header.Set(idemhttp.HeaderIdempotencyKey, "k")
				return r
			}
			r := newReq(tc.contentType)
			if tc.chunked {
				r.Body = io.NopCloser(bytes.NewReader(tc.body))
				r.ContentLength = -1
			}
			w := httptest.NewRecorder()
			handler.ServeHTTP(w, r)
			if w.Code != http.StatusCreated || !bytes.Equal(seen, tc.body) {
				t.Fatalf("%d %s; the handler read %d of %d bytes", w.Code, w.Body, len(seen), len(tc.body))
			}
			rec, err := store.Get(t.Context(), "", "k")
			if err != nil {
				t.Fatal(err)
			}
			ct := tc.contentType
			if tc.sameAs != "" {
				ct = tc.sameAs
				jsonFP, err := idemhttp.FingerprintV1(newReq(tc.contentType), tc.body)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Fingerprint == jsonFP {
					t.Errorf("a spooled JSON body has its canonical fingerprint; want the raw one")
				}
			}
			want, err := idemhttp.FingerprintV1(newReq(ct), tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Fingerprint != want {
				t.Errorf("fingerprint %s, FingerprintV1 gives %s", rec.Fingerprint, want)
			}
			if left := spoolLeftovers(t, dir); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestSpoolHandlerPanics: a handler that panics halfway through a spooled
// body releases the key, and leaves no spool file or descriptor.
func TestSpoolHandlerPanics(t *testing.T) {
	t.Parallel()
	store, dir, m := spoolSetup(t, func(c *idemhttp.Config) { c.MaxRequestBody = 64 << 10 })
	handler := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.CopyN(io.Discard, r.Body, 1<<20); err != nil {
			t.Error(err)
		}
		panic("boom")
	}))
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the handler's panic", p)
			}
		}()
		handler.ServeHTTP(httptest.NewRecorder(), uploadRequest("k", newPatternBody(4<<20, -1), 4<<20))
	}()
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("record after the panic: %v, want it released", err)
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestSpoolClientGone: a client that goes away in the middle of an upload
// to a real server leaves no record, no spool file and no descriptor, and
// the handler never runs.
func TestSpoolClientGone(t *testing.T) {
	t.Parallel()
	store, dir, m := spoolSetup(t, nil)
	h := &uploadHandler{}
	ended := make(chan int, 1)
	guarded := m.Handler(h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := &statusWriter{ResponseWriter: w}
		defer func() { ended <- rw.status }()
		guarded.ServeHTTP(rw, r)
	}))
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	const announced = 64 << 20
	fmt.Fprintf(conn, "POST /uploads HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"+
		"Idempotency-Key: gone\r\nContent-Length: %d\r\n\r\n", announced)
	if _, err := io.CopyN(conn, newPatternBody(announced, -1), 8<<20); err != nil {
		t.Fatal(err)
	}
	// Wait until the server spools (Linux: its descriptor is open), so
	// that the client goes away mid-spool, not before.
	if runtime.GOOS == "linux" {
		deadline := time.Now().Add(10 * time.Second)
		for len(openSpools(t, dir)) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if len(openSpools(t, dir)) == 0 {
			t.Error("no spool file was opened for the upload")
		}
	}
	_ = conn.Close()

	select {
	case status := <-ended:
		if status != http.StatusBadRequest {
			t.Errorf("answered %d to the client that went away, want 400", status)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request did not end after its client went away")
	}
	if runs := h.runs.Load(); runs != 0 {
		t.Errorf("the handler ran %d times", runs)
	}
	if _, err := store.Get(t.Context(), "", "gone"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("record after the client went away: %v, want none", err)
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// statusWriter records the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestSpoolLimits: a body over MaxStreamedBody is answered 413 (at once
// when its Content-Length says so, after MaxStreamedBody bytes when it has
// none), a body within MaxRequestBody is not spooled, and none of them
// leaves a record or a file.
func TestSpoolLimits(t *testing.T) {
	t.Parallel()
	const memLimit, streamLimit = 64 << 10, 1 << 20
	for _, tc := range []struct {
		name       string
		size, sent int64 // bytes in the body; its Content-Length (-1: none)
		status     int
	}{
		{"announced over the limit", streamLimit + 1, streamLimit + 1, http.StatusRequestEntityTooLarge},
		{"chunked over the limit", streamLimit + 1, -1, http.StatusRequestEntityTooLarge},
		{"at the limit", streamLimit, streamLimit, http.StatusCreated},
		{"chunked at the limit", streamLimit, -1, http.StatusCreated},
		{"in memory", memLimit, -1, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store, dir, m := spoolSetup(t, func(c *idemhttp.Config) {
				c.MaxRequestBody, c.MaxStreamedBody = memLimit, streamLimit
			})
			h := &uploadHandler{}
			var spooled bool
			h.onRun = func(*http.Request) { spooled = len(openSpools(t, dir)) > 0 }
			body := newPatternBody(tc.size, -1)
			w := httptest.NewRecorder()
			m.Handler(h).ServeHTTP(w, uploadRequest("k", body, tc.sent))
			if w.Code != tc.status {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.status)
			}
			if runtime.GOOS == "linux" && h.runs.Load() > 0 && spooled != (tc.size > memLimit) {
				t.Errorf("a body of %d bytes spooled: %t; MaxRequestBody is %d", tc.size, spooled, memLimit)
			}
			if tc.status == http.StatusRequestEntityTooLarge {
				wantProblem(t, w, http.StatusRequestEntityTooLarge, idemhttp.CodeBodyTooLarge)
				if tc.sent >= 0 && body.off != 0 {
					t.Errorf("%d bytes of a body announced too large were read", body.off)
				}
				if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("record: %v, want none", err)
				}
				if h.runs.Load() != 0 {
					t.Error("the handler ran")
				}
			} else if h.read.Load() != tc.size || h.sums[0] != patternSum(tc.size, -1) {
				t.Errorf("the handler read %d bytes, want the %d sent", h.read.Load(), tc.size)
			}
			if left := spoolLeftovers(t, dir); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestSpoolUnavailable: a spool directory that has gone away answers 503
// SPOOL_UNAVAILABLE with Retry-After, and makes no record.
func TestSpoolUnavailable(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	store := memstore.New(nil)
	m, err := idemhttp.New(&idemhttp.Config{Store: store, SpoolBody: true, SpoolDir: dir, MaxRequestBody: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	h := &uploadHandler{}
	w := httptest.NewRecorder()
	m.Handler(h).ServeHTTP(w, uploadRequest("k", newPatternBody(4096, -1), 4096))
	wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.CodeSpoolUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) || h.runs.Load() != 0 {
		t.Errorf("record %v, %d runs; want none", err, h.runs.Load())
	}
}

// TestSpoolFailOpen: with the store down and FailOpen, the handler runs
// unguarded and reads the whole spooled body.
func TestSpoolFailOpen(t *testing.T) {
	t.Parallel()
	store := &flakyStore{Store: memstore.New(nil)}
	store.acquire.Store(true)
	dir := t.TempDir()
	m, err := idemhttp.New(&idemhttp.Config{Store: store, SpoolBody: true, SpoolDir: dir, MaxRequestBody: 4096, FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	h := &uploadHandler{}
	w := httptest.NewRecorder()
	const size = 1 << 20
	m.Handler(h).ServeHTTP(w, uploadRequest("k", newPatternBody(size, -1), size))
	if w.Code != http.StatusCreated || h.read.Load() != size || h.sums[0] != patternSum(size, -1) {
		t.Errorf("%d %s; the handler read %d bytes", w.Code, w.Body, h.read.Load())
	}
	if left := spoolLeftovers(t, dir); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestSpoolConfig: New refuses spool settings that cannot work, with an
// error that names them.
func TestSpoolConfig(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fp := func(*http.Request, []byte) (idem.Fingerprint, error) { return "x", nil }
	key := func(*http.Request, []byte) (string, error) { return "x", nil }
	for _, tc := range []struct {
		name string
		cfg  idemhttp.Config
		want string // in the error; "" means no error
	}{
		{"defaults", idemhttp.Config{SpoolBody: true}, ""},
		{"limits", idemhttp.Config{SpoolBody: true, MaxRequestBody: 10, MaxStreamedBody: 11}, ""},
		{"negative MaxStreamedBody", idemhttp.Config{SpoolBody: true, MaxStreamedBody: -1}, "negative MaxStreamedBody"},
		{"MaxStreamedBody without SpoolBody", idemhttp.Config{MaxStreamedBody: 1 << 30}, "SpoolBody is not"},
		{"SpoolDir without SpoolBody", idemhttp.Config{SpoolDir: t.TempDir()}, "SpoolBody is not"},
		{"MaxStreamedBody not above MaxRequestBody", idemhttp.Config{SpoolBody: true, MaxRequestBody: 1 << 20, MaxStreamedBody: 1 << 20}, "must be larger than MaxRequestBody"},
		{"MaxRequestBody over the default MaxStreamedBody", idemhttp.Config{SpoolBody: true, MaxRequestBody: 2 << 30}, "must be larger than MaxRequestBody"},
		{"custom Fingerprint", idemhttp.Config{SpoolBody: true, Fingerprint: fp}, "custom Fingerprint"},
		{"Key", idemhttp.Config{SpoolBody: true, Key: key}, "combined with Key"},
		{"SpoolDir missing", idemhttp.Config{SpoolBody: true, SpoolDir: filepath.Join(file, "nothing")}, "SpoolDir"},
		{"SpoolDir a file", idemhttp.Config{SpoolBody: true, SpoolDir: file}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Store = memstore.New(nil)
			_, err := idemhttp.New(&cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("New: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("New: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// BenchmarkSpooledUpload: a 100 MiB upload (generated as it is read)
// through a middleware with SpoolBody on memstore, a first execution (a
// new key) and a replay (a retry of the same upload), against the bare
// handler reading and hashing the same body.
//
//	go test -run '^$' -bench '^BenchmarkSpooledUpload$' -benchmem -count 5 ./idemhttp/
func BenchmarkSpooledUpload(b *testing.B) {
	const size = 100 << 20
	serve := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		b.SetBytes(size)
		i := 0
		for b.Loop() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, uploadRequest(key(i), newPatternBody(size, -1), size))
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			i++
		}
	}
	guarded := func(b *testing.B) http.Handler {
		m, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), SpoolBody: true, SpoolDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		return m.Handler(&uploadHandler{})
	}
	b.Run("bare", func(b *testing.B) {
		serve(b, &uploadHandler{}, func(i int) string { return "k" })
	})
	b.Run("first", func(b *testing.B) {
		serve(b, guarded(b), func(i int) string { return fmt.Sprint("k-", i) })
	})
	b.Run("replay", func(b *testing.B) {
		h := guarded(b)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, uploadRequest("same", newPatternBody(size, -1), size))
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
		serve(b, h, func(int) string { return "same" })
	})
	// The three in one loop (internal/benchpair), for ratios that the
	// load of a shared machine does not swing; its ns/op is a whole
	// iteration, read the -ns metrics.
	b.Run("interleaved", func(b *testing.B) {
		bare, h := &uploadHandler{}, guarded(b)
		i := 0
		send := func(h http.Handler, key string) func() {
			return func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, uploadRequest(key, newPatternBody(size, -1), size))
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		}
		send(h, "same")()
		first := send(h, "")
		means := benchpair.Run(b,
			benchpair.Func{Name: "bare", F: send(bare, "k")},
			benchpair.Func{Name: "first", F: func() { first() }, Before: func() {
				i++
				first = send(h, fmt.Sprint("k-", i))
			}},
			benchpair.Func{Name: "replay", F: send(h, "same")},
		)
		if means[0] > 0 {
			b.ReportMetric(means[1]/means[0], "first/bare")
			b.ReportMetric(means[2]/means[0], "replay/bare")
		}
	})
}

// TestSpoolAnnouncedLength: around MaxRequestBody, a body whose
// Content-Length is right, missing, too small or too large (a request
// made in process, which no server checks) reaches the handler whole
// and is fingerprinted as FingerprintV1 fingerprints its bytes: a
// fingerprint hashed while spooling from a wrong announced length is
// hashed again from the spool. A retry of the same bytes without
// Content-Length replays.
func TestSpoolAnnouncedLength(t *testing.T) {
	t.Parallel()
	const memLimit = 4096
	for _, size := range []int64{memLimit, memLimit + 1, memLimit + 2, 3*memLimit + 7} {
		for _, delta := range []int64{0, -1, 1, -size + memLimit + 1, 1 << 10} {
			t.Run(fmt.Sprintf("%d bytes announced %+d", size, delta), func(t *testing.T) {
				t.Parallel()
				store, dir, m := spoolSetup(t, func(c *idemhttp.Config) {
					c.MaxRequestBody, c.MaxStreamedBody = memLimit, 1<<20
				})
				h := &uploadHandler{}
				handler := m.Handler(h)
				w := httptest.NewRecorder()
				handler.ServeHTTP(w, uploadRequest("k", newPatternBody(size, -1), size+delta))
				if w.Code != http.StatusCreated || h.read.Load() != size || h.sums[0] != patternSum(size, -1) {
					t.Fatalf("%d %s; the handler read %d of %d bytes", w.Code, w.Body, h.read.Load(), size)
				}
				body, _ := io.ReadAll(newPatternBody(size, -1))
				want, err := idemhttp.FingerprintV1(uploadRequest("k", nil, size), body)
				if err != nil {
					t.Fatal(err)
				}
				if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.Fingerprint != want {
					t.Fatalf("record %+v, %v; want fingerprint %s", rec, err, want)
				}
				w = httptest.NewRecorder()
				handler.ServeHTTP(w, uploadRequest("k", newPatternBody(size, -1), -1))
				if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" || h.runs.Load() != 1 {
					t.Errorf("retry without Content-Length: %d %v, %d runs; want a replay", w.Code, w.Header(), h.runs.Load())
				}
				if left := spoolLeftovers(t, dir); len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
			})
		}
	}
}
