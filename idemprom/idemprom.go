package idemprom

import (
	"context"
	"errors"
	"sync"

	"github.com/idemkit/idem"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configures an Observer. The zero value of each field means its
// default.
type Options struct {
	// RequestBuckets are the buckets of idem_request_duration_seconds, in
	// seconds. Nil means prometheus.DefBuckets (5 ms to 10 s).
	RequestBuckets []float64
	// StoreBuckets are the buckets of
	// idem_store_operation_duration_seconds. Nil means DefaultStoreBuckets
	// (100 µs to 2.4 s).
	StoreBuckets []float64
	// ConstLabels are added to every metric (an instance's role, say).
	ConstLabels prometheus.Labels
}

// DefaultStoreBuckets are the default buckets of
// idem_store_operation_duration_seconds: 100 µs, then ×2.5 up to 2.4 s.
var DefaultStoreBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 12)

// Observer is an idem.Observer that counts what it is told in Prometheus
// metrics (see the package documentation for the list). It is also a
// prometheus.Collector of those metrics, which New registers. It is safe
// for concurrent use.
type Observer struct {
	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	storeDuration   *prometheus.HistogramVec
	storeErrors     *prometheus.CounterVec
	leaseRenewals   *prometheus.CounterVec
	leasesLost      prometheus.Counter
	swept           *prometheus.CounterVec
	locks           *prometheus.CounterVec
	tokens          *prometheus.CounterVec
	inbox           *prometheus.CounterVec
	outboxPublished *prometheus.CounterVec
	outboxBacklog   *prometheus.GaugeVec
	outboxLag       *prometheus.GaugeVec

	all []prometheus.Collector

	// Caches of the children of the hot paths, by label values.
	reqCache   sync.Map // labels2 → *reqChildren
	storeCache sync.Map // labels3 → *storeChildren
}

type labels2 struct{ a, b string }
type labels3 struct{ a, b, c string }

type reqChildren struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

type storeChildren struct {
	duration prometheus.Observer
	errors   prometheus.Counter // nil for a result other than error
}

var _ idem.Observer = (*Observer)(nil)
var _ prometheus.Collector = (*Observer)(nil)

// New returns an Observer whose metrics are registered with reg (nil
// means prometheus.DefaultRegisterer). A nil opts means defaults. It
// fails if reg already holds metrics of the same names.
func New(reg prometheus.Registerer, opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.RequestBuckets == nil {
		o.RequestBuckets = prometheus.DefBuckets
	}
	if o.StoreBuckets == nil {
		o.StoreBuckets = DefaultStoreBuckets
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	cl := o.ConstLabels
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, labels)
	}
	ob := &Observer{
		requests: counter("idem_requests_total",
			"Guarded requests by route and outcome (executed, replayed, in_flight, mismatch, missing_key, invalid_key, invalid_request, unauthenticated, store_error, too_large, lease_lost, released, passed).",
			"route", "outcome"),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_request_duration_seconds",
			Help: "Time from a guarded request's arrival to its answer being decided, by route and outcome.", ConstLabels: cl,
			Buckets: o.RequestBuckets}, []string{"route", "outcome"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_store_operation_duration_seconds",
			Help: "Duration of record store calls, by store, operation and result (ok, error).", ConstLabels: cl,
			Buckets: o.StoreBuckets}, []string{"store", "operation", "result"}),
		storeErrors: counter("idem_store_errors_total",
			"Record store calls that failed (not answers such as not found or lease lost), by store and operation.",
			"store", "operation"),
		leaseRenewals: counter("idem_lease_renewals_total",
			"Lease renewals by the watchdog, by result (renewed, renew_failed).", "result"),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_leases_lost_total",
			Help: "Executions whose lease was lost (taken over, or not renewed in time).", ConstLabels: cl}),
		swept: counter("idem_swept_total",
			"Rows removed by sweeps, by store and what was swept (records, tokens, inbox, outbox).", "store", "what"),
		locks: counter("idem_lock_operations_total",
			"Lock operations by result (acquired, contended, lost, released).", "result"),
		tokens: counter("idem_token_operations_total",
			"Submit token operations by operation (issue, consume) and result (issued, consumed, used, invalid, error).",
			"operation", "result"),
		inbox: counter("idem_inbox_messages_total",
			"Messages handled by an inbox, by consumer group and result (processed, duplicate, retried, dead, in_flight).",
			"group", "result"),
		outboxPublished: counter("idem_outbox_published_total",
			"Messages an outbox relay published, by relay.", "relay"),
		outboxBacklog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_backlog",
			Help: "Rows pending in an outbox at the relay's last measure, by relay.", ConstLabels: cl}, []string{"relay"}),
		outboxLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_lag_seconds",
			Help: "How long the oldest pending outbox row had waited at the relay's last measure, by relay.", ConstLabels: cl}, []string{"relay"}),
	}
	ob.all = []prometheus.Collector{ob.requests, ob.requestDuration, ob.storeDuration, ob.storeErrors,
		ob.leaseRenewals, ob.leasesLost, ob.swept, ob.locks, ob.tokens, ob.inbox,
		ob.outboxPublished, ob.outboxBacklog, ob.outboxLag}
	if err := reg.Register(ob); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return nil, errors.New("idemprom: the registerer already holds idem's metrics (one Observer per registry)")
		}
		return nil, err
	}
	return ob, nil
}

// Describe describes every metric of the Observer.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.all {
		c.Describe(ch)
	}
}

// Collect collects every metric of the Observer.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.all {
		c.Collect(ch)
	}
}

// Start returns ctx: metrics are counted when an operation ends.
func (o *Observer) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }

// End counts e.
func (o *Observer) End(_ context.Context, e idem.Event) {
	switch e.Kind {
	case idem.KindRequest:
		k := labels2{e.Route, e.Outcome}
		c, ok := o.reqCache.Load(k)
		if !ok {
			c, _ = o.reqCache.LoadOrStore(k, &reqChildren{
				count:    o.requests.WithLabelValues(e.Route, e.Outcome),
				duration: o.requestDuration.WithLabelValues(e.Route, e.Outcome),
			})
		}
		rc := c.(*reqChildren)
		rc.count.Inc()
		rc.duration.Observe(e.Duration.Seconds())
	case idem.KindStore:
		k := labels3{e.Store, e.Op, e.Outcome}
		c, ok := o.storeCache.Load(k)
		if !ok {
			sc := &storeChildren{duration: o.storeDuration.WithLabelValues(e.Store, e.Op, e.Outcome)}
			if e.Outcome == idem.OutcomeError {
				sc.errors = o.storeErrors.WithLabelValues(e.Store, e.Op)
			}
			c, _ = o.storeCache.LoadOrStore(k, sc)
		}
		sc := c.(*storeChildren)
		sc.duration.Observe(e.Duration.Seconds())
		if sc.errors != nil {
			sc.errors.Inc()
		}
	case idem.KindLease:
		if e.Outcome == idem.OutcomeLost {
			o.leasesLost.Inc()
		} else {
			o.leaseRenewals.WithLabelValues(e.Outcome).Inc()
		}
	case idem.KindSweep:
		o.swept.WithLabelValues(e.Store, e.Op).Add(float64(e.N))
	case idem.KindLock:
		o.locks.WithLabelValues(e.Outcome).Inc()
	case idem.KindToken:
		o.tokens.WithLabelValues(e.Op, e.Outcome).Inc()
	case idem.KindInbox:
		if e.Outcome != "" { // the End of a handling; a Start carries none
			o.inbox.WithLabelValues(e.Route, e.Outcome).Inc()
		}
	case idem.KindOutbox:
		switch e.Op {
		case idem.OpPublish:
			if e.Err == nil && e.N > 0 {
				o.outboxPublished.WithLabelValues(e.Route).Add(float64(e.N))
			}
		case idem.OpBacklog:
			o.outboxBacklog.WithLabelValues(e.Route).Set(float64(e.N))
			o.outboxLag.WithLabelValues(e.Route).Set(e.Age.Seconds())
		}
	}
}
