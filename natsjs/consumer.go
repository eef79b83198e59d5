package natsjs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	// DefaultAckWait is Config.AckWait's default.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is Config.MaxDeliver's default.
	DefaultMaxDeliver = 20
	// DefaultAckTimeout is Config.AckTimeout's default.
	DefaultAckTimeout = 5 * time.Second
	// DefaultDeadLetterPrefix starts the default dead-letter subject,
	// "idem.dead.<stream>.<durable>".
	DefaultDeadLetterPrefix = "idem.dead."
)

// Headers the adapter reads and writes.
const (
	// KeyHeader carries outbox.Message.Key (inbox.Message.Key on the
	// consumer's side).
	KeyHeader = "Idem-Key"
	// DeadReasonHeader is the reason a dead letter was dead-lettered.
	DeadReasonHeader = "Idem-Dead-Reason"
	// DeadIDHeader is the dead message's ID (the inbox's, derived or
	// "<stream>:<sequence>:<timestamp>" if the message had no
	// Nats-Msg-Id).
	DeadIDHeader = "Idem-Dead-Id"
	// DeadSubjectHeader is the subject the dead message was published on.
	DeadSubjectHeader = "Idem-Dead-Subject"
	// DeadStreamHeader and DeadSequenceHeader locate the dead message in
	// its stream; DeadConsumerHeader names the consumer that gave up.
	DeadStreamHeader   = "Idem-Dead-Stream"
	DeadSequenceHeader = "Idem-Dead-Sequence"
	DeadConsumerHeader = "Idem-Dead-Consumer"
	// DeadDeliveriesHeader is how many times the consumer received it.
	DeadDeliveriesHeader = "Idem-Dead-Deliveries"
)

// Process handles one message and says what to do with it: the inbox's
// HandleTx or Handle (see HandleTx and Handle in this package). The
// Consumer maps its Outcome to JetStream's acks.
type Process func(ctx context.Context, m inbox.Message) (inbox.Outcome, error)

// HandleTx returns a Process that handles each message with
// in.HandleTx(ctx, db, m, h): the effect and the consume record commit
// in one transaction.
func HandleTx(in *inbox.Inbox, db inbox.Beginner, h inbox.TxHandler) Process {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		return in.HandleTx(ctx, db, m, h)
	}
}

// Handle returns a Process that handles each message with
// in.Handle(ctx, m, h): the external-effect mode.
func Handle(in *inbox.Inbox, h inbox.Handler) Process {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		return in.Handle(ctx, m, h)
	}
}

// Config configures a Consumer. The zero value of each field means its
// default; Stream and Durable are required.
type Config struct {
	// Stream is the stream the consumer reads. Required.
	Stream string
	// Durable is the durable consumer's name (usually the inbox's
	// group). Consumers of one durable, in one process or many, share
	// its messages. Required.
	Durable string
	// FilterSubjects restricts the consumer to these subjects. Default:
	// all of the stream's.
	FilterSubjects []string
	// AckWait is how long the server waits for an ack before it
	// redelivers. While a message is handled, the consumer sends
	// InProgress every third of it. Default 30 s.
	AckWait time.Duration
	// MaxDeliver is the most times the server delivers a message. A
	// delivery that is the MaxDeliver-th and would be retried is
	// dead-lettered instead (the server would drop it silently). Keep it
	// above the inbox's MaxAttempts: deliveries that found the message
	// in progress elsewhere, or that died with their process, count too.
	// Default 20; negative: unlimited.
	MaxDeliver int
	// Workers is how many messages are handled at once. Default 1
	// (messages are handled in the stream's order, redeliveries aside).
	Workers int
	// MaxAckPending is the most messages delivered and not yet acked, for
	// all the durable's consumers together. Default: the server's (1000).
	MaxAckPending int
	// Prefetch is how many messages the client buffers. Default 2 ×
	// Workers, at least 16. A buffered message's AckWait runs already.
	Prefetch int
	// DeadLetterSubject is where a dead message is published (with
	// JetStream, awaiting its ack) before it is terminated, so that it
	// can be observed and retried: a stream must capture the subject.
	// Default "idem.dead.<Stream>.<Durable>".
	DeadLetterSubject string
	// AckTimeout bounds the wait for the server's confirmation of a
	// double ack and of a dead letter's publish. Default 5 s.
	AckTimeout time.Duration
	// Observe, if set, is called after each delivery is settled (from
	// the worker that handled it; it must not block long).
	Observe func(Event)
	// Logger receives settlement failures. Nil: discarded. A line
	// identifies its message by idem.key_hash (idem.HashKey("", the
	// message ID), as the inbox's Observer events do), never by its ID.
	Logger *slog.Logger
}

// Action is what the consumer did with a delivery.
type Action uint8

// Actions.
const (
	// Acked: the outcome was Processed or Duplicate; double-acked.
	Acked Action = iota + 1
	// Naked: Retry or InProgress; negatively acked with the outcome's
	// delay (or redelivered after a failed dead-lettering).
	Naked
	// DeadLettered: published to the dead-letter subject and terminated.
	DeadLettered
)

var actionNames = [...]string{Acked: "acked", Naked: "naked", DeadLettered: "dead-lettered"}

// String returns the action's name.
func (a Action) String() string {
	if int(a) < len(actionNames) && actionNames[a] != "" {
		return actionNames[a]
	}
	return fmt.Sprintf("natsjs.Action(%d)", uint8(a))
}

// Event reports a settled delivery to Config.Observe.
type Event struct {
	// Message is the delivery as the inbox saw it.
	Message inbox.Message
	// Sequence is the message's stream sequence; Delivered counts its
	// deliveries to this durable, from 1.
	Sequence  uint64
	Delivered uint64
	// Outcome is the Process's answer; Action what the consumer did.
	Outcome inbox.Outcome
	Action  Action
	// Err is the Process's error, or the failure of the action (a double
	// ack unconfirmed, a dead letter not published), nil otherwise.
	Err error
}

// Consumer consumes a JetStream durable pull consumer with explicit acks
// and hands each message to a Process: Processed and Duplicate are
// double-acked, Retry and InProgress negatively acked with the outcome's
// delay, Dead published to the dead-letter subject and terminated.
type Consumer struct {
	js      jetstream.JetStream
	cc      jetstream.ConsumerConfig // the durable's, to create it again
	process Process
	cfg     Config
	log     *slog.Logger

	mu   sync.Mutex
	cons jetstream.Consumer // the durable; replaced when Run creates it again
}

// NewConsumer creates (or updates) the durable pull consumer cfg names on
// its stream, with explicit acks, and returns a Consumer that hands its
// messages to p. cfg is copied.
func NewConsumer(ctx context.Context, js jetstream.JetStream, p Process, cfg *Config) (*Consumer, error) {
	if js == nil || p == nil || cfg == nil {
		return nil, errors.New("natsjs: NewConsumer needs a JetStream, a Process and a Config")
	}
	c := *cfg
	if c.Stream == "" || c.Durable == "" {
		return nil, errors.New("natsjs: NewConsumer: Config.Stream and Config.Durable are required")
	}
	if strings.ContainsAny(c.Durable, ".*> \t\r\n") {
		return nil, fmt.Errorf("natsjs: NewConsumer: durable name %q has '.', '*', '>' or a space", c.Durable)
	}
	switch {
	case c.AckWait < 0, c.Workers < 0, c.MaxAckPending < 0, c.Prefetch < 0, c.AckTimeout < 0:
		return nil, fmt.Errorf("natsjs: NewConsumer: negative setting in %+v", c)
	case c.AckWait > 0 && c.AckWait < 100*time.Millisecond:
		return nil, fmt.Errorf("natsjs: NewConsumer: AckWait %v is shorter than 100ms", c.AckWait)
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MaxDeliver < 0 {
		c.MaxDeliver = -1
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.Prefetch == 0 {
		c.Prefetch = max(2*c.Workers, 16)
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.DeadLetterSubject == "" {
		c.DeadLetterSubject = DefaultDeadLetterPrefix + c.Stream + "." + c.Durable
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cc := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
	}
	switch len(c.FilterSubjects) {
	case 0:
	case 1:
		cc.FilterSubject = c.FilterSubjects[0]
	default:
		cc.FilterSubjects = c.FilterSubjects
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: create consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	return &Consumer{js: js, cc: cc, cons: cons, process: p, cfg: c, log: log}, nil
}

// JetStreamConsumer returns the underlying durable consumer (for its
// Info).
func (c *Consumer) JetStreamConsumer() jetstream.Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cons
}

// DeadLetterSubject returns the subject dead messages are published to.
func (c *Consumer) DeadLetterSubject() string { return c.cfg.DeadLetterSubject }

// RestartDelay is how long Run waits before it consumes again after
// JetStream's Consume stopped by itself.
const RestartDelay = time.Second

// Run consumes until ctx ends, then stops pulling, waits for the messages
// being handled to be settled, and returns nil; or it returns the error
// that kept it from starting, or that ended it: the connection closed
// (nats.ErrConnectionClosed), the stream deleted.
//
// A connection that is cut and reconnects (within the connection's
// nats.MaxReconnects) does not end Run: JetStream pulls again after the
// reconnect, and the messages whose acks the cut lost are redelivered
// after AckWait and acked as duplicates. A connection whose reconnect
// attempts ran out is closed for good, and Run returns; connect with
// nats.MaxReconnects(-1) to ride out any outage. When Consume stops by
// itself on a live connection (the durable was deleted: "consumer
// deleted"), or its heartbeats stop and the durable is not found (it was
// deleted while the connection was down), Run creates the durable again
// after RestartDelay and goes on; a new durable delivers the stream from
// its start, and the inbox acks what it handled before as duplicates.
//
// Handlers run with a context that ctx's end does not cancel, so that a
// shutdown does not count as a failed attempt: Run returns only after
// they return. Messages buffered and not yet handled are left unacked
// and redelivered after AckWait.
func (c *Consumer) Run(ctx context.Context) error {
	work := make(chan jetstream.Msg)
	hctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for msg := range work {
				c.handle(hctx, msg)
			}
		})
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	stopping := make(chan struct{})
	deliver := func(msg jetstream.Msg) {
		select {
		case work <- msg:
		case <-stopping:
			// Not handled: redelivered at once, to another consumer.
			_ = msg.Nak()
		}
	}
	cons := c.JetStreamConsumer()
	for {
		cur := cons
		cc, err := cur.Consume(deliver, jetstream.PullMaxMessages(c.cfg.Prefetch), jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
			c.log.WarnContext(ctx, "natsjs: consume", "durable", c.cfg.Durable, "err", err)
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				// A durable deleted while the connection was down gets
				// pulls that nothing answers, and Consume pulls on
				// forever: stop it, to create the durable again.
				go c.probe(ctx, cur, cc)
			}
		}))
		if err != nil {
			return fmt.Errorf("natsjs: consume %s: %w", c.cfg.Durable, err)
		}
		select {
		case <-ctx.Done():
			close(stopping)
			cc.Stop()
			<-cc.Closed()
			return nil
		case <-cc.Closed():
		}
		// Consume stopped by itself.
		if err := c.closed(); err != nil {
			return err
		}
		c.log.WarnContext(ctx, "natsjs: consume stopped; consuming again", "durable", c.cfg.Durable, "after", RestartDelay)
		if cons, err = c.recreate(ctx); err != nil {
			return err
		}
		if cons == nil { // ctx ended
			return nil
		}
	}
}

// probe stops cc if the durable no longer exists.
func (c *Consumer) probe(ctx context.Context, cons jetstream.Consumer, cc jetstream.ConsumeContext) {
	ictx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
	defer cancel()
	if _, err := cons.Info(ictx); errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.log.WarnContext(ctx, "natsjs: the durable is gone", "durable", c.cfg.Durable)
		cc.Stop()
	}
}

// closed returns the error that ends Run when the connection is closed.
func (c *Consumer) closed() error {
	if c.js.Conn().IsClosed() {
		return fmt.Errorf("natsjs: consume %s: %w (its reconnect attempts ran out, or it was closed)", c.cfg.Durable, nats.ErrConnectionClosed)
	}
	return nil
}

// recreate creates the durable again, after RestartDelay and until it
// exists or ctx ends (nil, nil). It gives up when the connection is
// closed or the stream is gone.
func (c *Consumer) recreate(ctx context.Context) (jetstream.Consumer, error) {
	for {
		t := time.NewTimer(RestartDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
		if err := c.closed(); err != nil {
			return nil, err
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		cons, err := c.js.CreateOrUpdateConsumer(actx, c.cfg.Stream, c.cc)
		cancel()
		switch {
		case err == nil:
			c.mu.Lock()
			c.cons = cons
			c.mu.Unlock()
			return cons, nil
		case ctx.Err() != nil:
			return nil, nil
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, fmt.Errorf("natsjs: create consumer %s on %s: %w", c.cfg.Durable, c.cfg.Stream, err)
		}
		c.log.WarnContext(ctx, "natsjs: create consumer", "durable", c.cfg.Durable, "err", err)
	}
}

// Message returns the inbox's view of msg: the ID from its Nats-Msg-Id
// header, else "<stream>:<stream sequence>:<timestamp>", the timestamp
// being the stream's for the message, in Unix nanoseconds (a stream
// deleted and created again numbers its messages from 1 again; the
// timestamp keeps its messages from being taken for the old stream's);
// the topic is its subject, the key its Idem-Key header, the headers the
// first value of each.
func Message(msg jetstream.Msg) (inbox.Message, error) {
	h := msg.Headers()
	m := inbox.Message{
		ID:      h.Get(jetstream.MsgIDHeader),
		Topic:   msg.Subject(),
		Key:     h.Get(KeyHeader),
		Payload: msg.Data(),
	}
	if len(h) > 0 {
		m.Headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				m.Headers[k] = v[0]
			}
		}
	}
	if m.ID == "" {
		meta, err := msg.Metadata()
		if err != nil {
			return m, fmt.Errorf("natsjs: message metadata: %w", err)
		}
		seq, ts := strconv.FormatUint(meta.Sequence.Stream, 10), strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
		m.ID = meta.Stream + ":" + seq + ":" + ts
		if len(m.ID) > inbox.MaxIDLen { // a stream name of over 200 bytes
			m.ID = inbox.DeriveID(meta.Stream, seq, ts)
		}
	}
	return m, nil
}

// handle runs one delivery through the Process and settles it.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to ack.
		c.log.WarnContext(ctx, "natsjs: message without metadata", "subject", msg.Subject(), "err", err)
		return
	}
	m, _ := Message(msg)
	ev := Event{Message: m, Sequence: meta.Sequence.Stream, Delivered: meta.NumDelivered}

	stop := c.heartbeat(msg)
	o, perr := c.call(ctx, m)
	stop()
	ev.Outcome, ev.Err = o, perr

	switch {
	case o.Result.Ack():
		ev.Action = Acked
		actx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		if err := msg.DoubleAck(actx); err != nil {
			// Unconfirmed: if the ack was lost, the redelivery is a
			// duplicate and is acked then.
			ev.Err = fmt.Errorf("natsjs: double ack: %w", err)
		}
		cancel()
	case o.Result == inbox.Dead:
		c.deadLetter(ctx, msg, meta, &ev, reasonOf(o, perr))
	default: // Retry, InProgress, or a Process without an outcome
		last := c.cfg.MaxDeliver > 0 && meta.NumDelivered >= uint64(c.cfg.MaxDeliver)
		if last {
			c.deadLetter(ctx, msg, meta, &ev, fmt.Sprintf("delivered %d times (MaxDeliver), last: %s", meta.NumDelivered, reasonOf(o, perr)))
			break
		}
		ev.Action = Naked
		delay := o.Delay
		if o.Result != inbox.Retry && o.Result != inbox.InProgress && delay == 0 {
			delay = time.Second
		}
		if err := msg.NakWithDelay(delay); err != nil {
			ev.Err = errors.Join(ev.Err, fmt.Errorf("natsjs: nak: %w", err))
		}
	}
	if ev.Err != nil && ev.Action != Acked {
		c.log.WarnContext(ctx, "natsjs: delivery", idem.LogKey("", m.ID, false), "seq", ev.Sequence, "result", o.Result.String(), "action", ev.Action.String(), "err", ev.Err)
	} else if ev.Err != nil {
		c.log.WarnContext(ctx, "natsjs: ack", idem.LogKey("", m.ID, false), "seq", ev.Sequence, "err", ev.Err)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(ev)
	}
}

// call runs the Process, turning a panic into a Retry.
func (c *Consumer) call(ctx context.Context, m inbox.Message) (o inbox.Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("natsjs: process panicked: %v", r)
			o = inbox.Outcome{Result: inbox.Retry, ID: m.ID, Delay: time.Second, Err: err}
		}
	}()
	return c.process(ctx, m)
}

// heartbeat sends InProgress every third of AckWait until stop is called,
// so that the server does not redeliver a message being handled.
func (c *Consumer) heartbeat(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(c.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// deadLetter publishes msg to the dead-letter subject and, once the
// stream confirmed it, terminates msg with the reason. If the publish
// fails, msg is negatively acked instead, to be dead-lettered on its
// redelivery: a dead message is never dropped unseen.
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, ev *Event, reason string) {
	reason = cut(reason, 1024)
	dl := nats.NewMsg(c.cfg.DeadLetterSubject)
	dl.Data = msg.Data()
	for k, v := range msg.Headers() {
		if strings.HasPrefix(k, "Nats-") {
			continue // Nats-Msg-Id and the expectations belong to the original
		}
		dl.Header[k] = v
	}
	dl.Header.Set(DeadReasonHeader, reason)
	dl.Header.Set(DeadIDHeader, ev.Message.ID)
	dl.Header.Set(DeadSubjectHeader, msg.Subject())
	dl.Header.Set(DeadStreamHeader, meta.Stream)
	dl.Header.Set(DeadSequenceHeader, strconv.FormatUint(meta.Sequence.Stream, 10))
	dl.Header.Set(DeadConsumerHeader, c.cfg.Durable)
	dl.Header.Set(DeadDeliveriesHeader, strconv.FormatUint(meta.NumDelivered, 10))
	pctx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
	defer cancel()
	// A dead letter published again (the consumer died before Term) is
	// dropped by the dead-letter stream's duplicate window.
	dlID := "dead:" + meta.Stream + ":" + c.cfg.Durable + ":" + strconv.FormatUint(meta.Sequence.Stream, 10)
	if _, err := c.js.PublishMsg(pctx, dl, jetstream.WithMsgID(dlID)); err != nil {
		ev.Action = Naked
		ev.Err = errors.Join(ev.Err, fmt.Errorf("natsjs: dead-letter to %s: %w", c.cfg.DeadLetterSubject, err))
		if nerr := msg.NakWithDelay(max(time.Second, c.cfg.AckWait/3)); nerr != nil {
			ev.Err = errors.Join(ev.Err, fmt.Errorf("natsjs: nak: %w", nerr))
		}
		return
	}
	ev.Action = DeadLettered
	term := msg.Term
	if termReasonSupported(c.js.Conn().ConnectedServerVersion()) {
		term = func() error { return msg.TermWithReason(reason) }
	}
	if err := term(); err != nil {
		ev.Err = errors.Join(ev.Err, fmt.Errorf("natsjs: term: %w", err))
	}
}

// termReasonSupported reports whether a server of version v honours
// TermWithReason: 2.10.4 and later; older servers ignore the whole
// acknowledgement, so Term is sent to them instead.
func termReasonSupported(v string) bool {
	var ver [3]int
	for i, f := range strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3) {
		f, _, _ = strings.Cut(f, "-")
		n, err := strconv.Atoi(f)
		if err != nil {
			return false
		}
		ver[i] = n
	}
	return ver[0] > 2 || ver[0] == 2 && (ver[1] > 10 || ver[1] == 10 && ver[2] >= 4)
}

func reasonOf(o inbox.Outcome, err error) string {
	switch {
	case o.Err != nil:
		return o.Err.Error()
	case err != nil:
		return err.Error()
	case o.Result == 0:
		return "no outcome"
	}
	return o.Result.String()
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
