package killsoak_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// figures are what the clients saw, counted over every attempt.
type figures struct {
	requests    atomic.Int64 // attempts sent
	replays     atomic.Int64 // answers with Idempotent-Replayed: true
	conflicts   atomic.Int64 // 409s of any code
	processing  atomic.Int64 // 409 PROCESSING (retried)
	serverErrs  atomic.Int64 // 5xx (retried)
	connErrs    atomic.Int64 // no answer: refused, reset, timed out (retried)
	gaveUp      atomic.Int64 // requests left without a final answer
	operations  atomic.Int64 // requests that got a final answer
	retriedOps  atomic.Int64 // of those, answered after more than one attempt
	otherFinals atomic.Int64 // final answers other than 2xx and 409
}

func (f *figures) String() string {
	return fmt.Sprintf("%d requests (attempts) for %d operations (%d needed a retry, %d gave up); %d replays (Idempotent-Replayed); %d 409s (%d PROCESSING); %d 5xx; %d connection errors; %d other 4xx",
		f.requests.Load(), f.operations.Load(), f.retriedOps.Load(), f.gaveUp.Load(), f.replays.Load(),
		f.conflicts.Load(), f.processing.Load(), f.serverErrs.Load(), f.connErrs.Load(), f.otherFinals.Load())
}

// lb is a client behind a load balancer: a request that gets no answer
// or a 5xx is sent again, with the same Idempotency-Key, to the next
// instance; a 409 PROCESSING is sent again after its Retry-After. It
// gives up after patience.
type lb struct {
	bases    []string
	http     *http.Client
	fig      *figures
	patience time.Duration
}

func newLB(bases []string, fig *figures) *lb {
	return &lb{
		bases: bases,
		http: &http.Client{
			Timeout:   15 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		},
		fig: fig,
		// An attempt that died with its instance holds the key for the
		// lease (30 s) before a retry may run it again.
		patience: 3 * time.Minute,
	}
}

// call is one request: what lb sends at each attempt.
type call struct {
	path   string
	user   int64  // X-User-ID (0: none)
	key    string // Idempotency-Key ("": none)
	token  string // Submit-Token ("": none)
	body   []byte
	signed bool // a payment callback, signed at each attempt
}

// answer is the final answer to a call.
type answer struct {
	status   int
	body     []byte
	replayed bool
	attempts int
}

// code is the problem code of a refusal.
func (a answer) code() string {
	var p struct{ Code string }
	json.Unmarshal(a.body, &p)
	return p.Code
}

var errGaveUp = errors.New("gave up")

// post sends c until it gets a final answer, or gives up.
func (c *lb) post(cl call) (answer, error) {
	start := rand.IntN(len(c.bases))
	deadline := time.Now().Add(c.patience)
	for attempt := 1; ; attempt++ {
		base := c.bases[(start+attempt-1)%len(c.bases)]
		a, retry := c.attempt(base, cl)
		a.attempts = attempt
		if !retry {
			c.fig.operations.Add(1)
			if attempt > 1 {
				c.fig.retriedOps.Add(1)
			}
			if a.status >= 400 && a.status != http.StatusConflict {
				c.fig.otherFinals.Add(1)
			}
			return a, nil
		}
		if time.Now().After(deadline) {
			c.fig.gaveUp.Add(1)
			return a, errGaveUp
		}
		pause := min(20*time.Millisecond<<min(attempt, 6), time.Second)
		time.Sleep(pause/2 + rand.N(pause/2))
	}
}

// attempt sends cl once to base: the answer, and whether to try again.
func (c *lb) attempt(base string, cl call) (answer, bool) {
	req, err := http.NewRequest(http.MethodPost, base+cl.path, bytes.NewReader(cl.body))
	if err != nil {
		panic(err)
	}
	if len(cl.body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.user != 0 {
		req.Header.Set("X-User-ID", strconv.FormatInt(cl.user, 10))
	}
	if cl.key != "" {
		req.Header.Set("Idempotency-Key", cl.key)
	}
	if cl.token != "" {
		req.Header.Set("Submit-Token", cl.token)
	}
	if cl.signed {
		req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(paySecret, time.Now(), cl.body))
	}
	c.fig.requests.Add(1)
	resp, err := c.http.Do(req)
	if err != nil {
		c.fig.connErrs.Add(1)
		return answer{}, true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.fig.connErrs.Add(1)
		return answer{}, true
	}
	a := answer{status: resp.StatusCode, body: body, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if a.replayed {
		c.fig.replays.Add(1)
	}
	switch {
	case a.status >= 500:
		c.fig.serverErrs.Add(1)
		return a, true
	case a.status == http.StatusConflict:
		c.fig.conflicts.Add(1)
		if a.code() == "PROCESSING" {
			c.fig.processing.Add(1)
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				time.Sleep(min(time.Duration(s)*time.Second, 2*time.Second))
			}
			return a, true
		}
	}
	return a, false
}
