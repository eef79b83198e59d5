package idemgrpc

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Defaults of ClientConfig.
const (
	DefaultMaxAttempts = 5
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 5 * time.Second
	// DefaultMaxRetryDelay is the longest RetryInfo delay a Client waits
	// for when ClientConfig.MaxRetryDelay is 0, as idemclient's
	// DefaultMaxRetryAfter.
	DefaultMaxRetryDelay = 30 * time.Second
)

// ClientConfig configures a Client. The zero value of each field means its
// default; a nil *ClientConfig means all defaults.
type ClientConfig struct {
	// Covers reports whether calls of the method (its full name,
	// "/package.Service/Method") get a key and are retried; other calls
	// pass through untouched, never retried. Nil means every method called
	// through the interceptor: install it only on connections to guarded
	// services, or set Covers (MethodsIn makes an allow-list).
	Covers func(fullMethod string) bool

	// MaxAttempts is how many times a call is tried at most, the first
	// included. Zero means DefaultMaxAttempts (5); 1 never retries.
	MaxAttempts int

	// BaseDelay and MaxDelay shape the backoff: before retry n (from 1)
	// the client waits a random time between 0 and
	// min(MaxDelay, BaseDelay·2^(n-1)) ("full jitter"), or the delay of the
	// answer's RetryInfo detail when it has one. Zero means
	// DefaultBaseDelay (100 ms) and DefaultMaxDelay (5 s).
	BaseDelay, MaxDelay time.Duration

	// MaxRetryDelay is the longest RetryInfo delay the client waits for:
	// an answer that asks for a longer wait is returned to the caller at
	// once, whether or not the call has a deadline. Zero means
	// DefaultMaxRetryDelay (30 s).
	MaxRetryDelay time.Duration

	// Retry reports whether an answer with this code is retried. It is
	// never asked about OK. Nil means DefaultRetry.
	Retry func(codes.Code) bool

	// NewKey returns a fresh idempotency key for a covered call that has
	// none. Nil means NewKey.
	NewKey func() string
}

// DefaultRetry is the retry policy when ClientConfig.Retry is nil: the
// codes that say the same call may succeed later (as the HTTP client
// retries 409 PROCESSING, 429, 502, 503 and 504): Unavailable (also a
// connection that failed), Aborted (a call with the key still in flight),
// ResourceExhausted, and DeadlineExceeded when the caller's own context
// is still live (a deadline of the server's). Internal and Unknown are
// not retried: they are the server's bugs more often than its weather.
func DefaultRetry(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// NewKey returns a random idempotency key: 128 bits from crypto/rand,
// base64url without padding (22 characters).
func NewKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Client is the client half of the contract: it gives each covered call an
// idempotency key, unless the caller set one, and retries the call with
// the same key. Build it with NewClient; it is safe for concurrent use.
type Client struct {
	covers      func(string) bool
	retry       func(codes.Code) bool
	newKey      func() string
	maxAttempts int
	base, max   time.Duration
	maxRetry    time.Duration
}

// NewClient returns a Client for cfg, which it copies; nil means defaults.
// It refuses negative values and a MaxDelay below BaseDelay.
func NewClient(cfg *ClientConfig) (*Client, error) {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.MaxAttempts < 0:
		return nil, fmt.Errorf("idemgrpc: negative MaxAttempts %d", c.MaxAttempts)
	case c.BaseDelay < 0, c.MaxDelay < 0, c.MaxRetryDelay < 0:
		return nil, fmt.Errorf("idemgrpc: negative BaseDelay %v, MaxDelay %v or MaxRetryDelay %v", c.BaseDelay, c.MaxDelay, c.MaxRetryDelay)
	}
	cl := &Client{covers: c.Covers, retry: c.Retry, newKey: c.NewKey, maxAttempts: c.MaxAttempts,
		base: c.BaseDelay, max: c.MaxDelay, maxRetry: c.MaxRetryDelay}
	if cl.retry == nil {
		cl.retry = DefaultRetry
	}
	if cl.newKey == nil {
		cl.newKey = NewKey
	}
	if cl.maxAttempts == 0 {
		cl.maxAttempts = DefaultMaxAttempts
	}
	if cl.base == 0 {
		cl.base = DefaultBaseDelay
	}
	if cl.max == 0 {
		cl.max = DefaultMaxDelay
	}
	if cl.maxRetry == 0 {
		cl.maxRetry = DefaultMaxRetryDelay
	}
	if cl.max < cl.base {
		return nil, fmt.Errorf("idemgrpc: MaxDelay %v is below BaseDelay %v", cl.max, cl.base)
	}
	return cl, nil
}

// Unary is the grpc.UnaryClientInterceptor: install it with
// grpc.WithChainUnaryInterceptor(c.Unary). A covered call without
// idempotency-key metadata gets a fresh key (NewKey); one that has a key
// keeps it. The call is retried with that key while its answer's code is
// one Retry accepts and the answer is not a replay (marked
// idempotency-replayed: true: the key's stored answer, which a retry
// would get again), up to MaxAttempts, waiting between attempts (the
// answer's RetryInfo delay, else the jittered backoff). It stops as soon
// as the context ends, and does not start a wait that would outlast the
// context's deadline or a RetryInfo delay beyond MaxRetryDelay: the call
// then returns the last answer's error.
func (c *Client) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if c.covers != nil && !c.covers(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md[MetadataKey]) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, c.newKey())
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// Each attempt's header metadata, to see a replay: the key's stored
	// answer, which every retry would get again.
	var header metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header))
	for attempt := 1; ; attempt++ {
		header = nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || attempt >= c.maxAttempts || ctx.Err() != nil || replayed(header) {
			return err
		}
		st := status.Convert(err)
		if !c.retry(st.Code()) {
			return err
		}
		d, ok := retryDelay(st)
		switch {
		case !ok:
			d = c.backoff(attempt)
		case d > c.maxRetry:
			return err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return err
		case <-timer.C:
		}
	}
}

// replayed reports whether header marks the answer as a replay.
func replayed(header metadata.MD) bool {
	v := header.Get(MetadataReplayed)
	return len(v) == 1 && v[0] == "true"
}

// backoff is the full-jitter wait before retry n (from 1).
func (c *Client) backoff(n int) time.Duration {
	ceiling := c.base
	for k := 1; k < n && ceiling < c.max; k++ {
		if ceiling > c.max/2 {
			ceiling = c.max
		} else {
			ceiling *= 2
		}
	}
	return rand.N(min(ceiling, c.max) + 1)
}

// retryDelay returns the delay of st's RetryInfo detail, if it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err != nil {
				continue
			}
			if d := ri.GetRetryDelay().AsDuration(); d >= 0 {
				return d, true
			}
		}
	}
	return 0, false
}
