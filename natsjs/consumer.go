package natsjs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

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
	// DefaultPullExpiry is Config.PullExpiry's default.
	DefaultPullExpiry = 5 * time.Second
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
// consumer loop (inbox.Consumer) maps its Outcome to JetStream's acks.
type Process = inbox.Process

// HandleTx returns a Process that handles each message with
// in.HandleTx(ctx, db, m, h): the effect and the consume record commit
// in one transaction.
func HandleTx(in *inbox.Inbox, db inbox.Beginner, h inbox.TxHandler) Process {
	return in.ProcessTx(db, h)
}

// Handle returns a Process that handles each message with
// in.Handle(ctx, m, h): the external-effect mode.
func Handle(in *inbox.Inbox, h inbox.Handler) Process { return in.Process(h) }

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
	// MaxDeliver is the most times a message is delivered before it is
	// dead-lettered: a delivery that is the MaxDeliver-th (by the
	// server's count of deliveries) and would be retried is
	// dead-lettered instead. The limit is the consumer's, not the
	// server's: the durable is created with an unlimited MaxDeliver, so
	// that the server never drops a message the consumer could not
	// dead-letter yet. A store error does not cost a delivery (the
	// consumer keeps the message and retries). Keep it above the inbox's
	// MaxAttempts: deliveries that found the message in progress
	// elsewhere, or that died with their process, count too (one that
	// finds it in progress is naked whatever its count, never
	// dead-lettered: the lease's holder settles it). Default 20;
	// negative: unlimited.
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
	// PullExpiry is how long each pull request the client sends lives;
	// the server's heartbeats come every half of it, and two missed ones
	// make the client pull again. It bounds how long the consumer sits
	// idle after the server holding its pulls is gone (the consumer's
	// leader in a cluster, killed or restarted): nats.go's own 30 s left
	// a consumer idle for 30 s after such a loss (the cluster failover
	// test found it). Default 5 s; at least 1 s.
	PullExpiry time.Duration
	// DeadLetterSubject is where a dead message is published (with
	// JetStream, awaiting its ack) before it is terminated, so that it
	// can be observed and retried: a stream must capture the subject
	// (NewConsumer logs a warning when none does: a dead message is held,
	// its publish retried, until one does; it refuses a subject the
	// consumer itself would receive). Default
	// "idem.dead.<Stream>.<Durable>".
	DeadLetterSubject string
	// AckTimeout bounds the wait for the server's confirmation of a
	// double ack and of a dead letter's publish. Default 5 s.
	AckTimeout time.Duration
	// DeriveFrom, when a message has no Nats-Msg-Id, names the fields
	// its ID is derived from (inbox.DeriveID), before the
	// "<stream>:<sequence>:<timestamp>" fallback: its business number,
	// event type and version (see inbox.ConsumerConfig.DeriveFrom).
	DeriveFrom func(m inbox.Message) []string
	// Backoff is the wait before the n-th retry of a store error or of
	// a dead-letter publish (the message is kept meanwhile). Default
	// inbox.DefaultBackoff: from 100 ms, doubling, to 10 s.
	Backoff func(n int) time.Duration
	// Observe, if set, is called after each delivery is settled (from
	// the worker that handled it; it must not block long).
	Observe func(Event)
	// Logger receives settlement failures. Nil: discarded. A line
	// identifies its message by idem.key_hash (idem.HashKey("", the
	// message ID), as the inbox's Observer events do), never by its ID.
	Logger *slog.Logger
}

// Action is what the consumer did with a delivery.
type Action = inbox.Action

// Actions.
const (
	// Acked: the outcome was Processed or Duplicate; double-acked.
	Acked = inbox.Acked
	// Naked: Retry or InProgress; negatively acked with the outcome's
	// delay (or the consumer stopped while it held the message).
	Naked = inbox.Naked
	// DeadLettered: published to the dead-letter subject and terminated.
	DeadLettered = inbox.DeadLettered
	// Terminated: a dead letter of this consumer delivered back to it
	// (the stream captures the dead-letter subject since NewConsumer
	// checked): terminated, never handled.
	Terminated = inbox.Terminated
)

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
	// Err is the failure of the action (a double ack unconfirmed), or
	// the Process's last store error when the consumer stopped before an
	// outcome, nil otherwise.
	Err error
	// StoreErrors counts the Process's store errors that the consumer
	// retried, keeping the message.
	StoreErrors int
}

// Consumer consumes a JetStream durable pull consumer with explicit acks
// and hands each message to the inbox's consumer loop (inbox.Consumer)
// with a Process: Processed and Duplicate are double-acked, Retry and
// InProgress negatively acked with the outcome's delay, Dead published
// to the dead-letter subject and terminated, a store error retried while
// the message is held.
type Consumer struct {
	js   jetstream.JetStream
	cc   jetstream.ConsumerConfig // the durable's, to create it again
	cfg  Config
	log  *slog.Logger
	loop *inbox.Consumer

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
	case c.PullExpiry != 0 && c.PullExpiry < time.Second:
		return nil, fmt.Errorf("natsjs: NewConsumer: PullExpiry %v is shorter than 1s", c.PullExpiry)
	}
	if c.PullExpiry == 0 {
		c.PullExpiry = DefaultPullExpiry
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
	if err := literalSubject(c.DeadLetterSubject); err != nil {
		return nil, fmt.Errorf("natsjs: NewConsumer: DeadLetterSubject: %w", err)
	}
	// The limit is enforced here, by the server's count: a server that
	// stopped delivering at MaxDeliver would drop a message whose dead
	// letter could not be published on its last delivery.
	cc := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}
	switch len(c.FilterSubjects) {
	case 0:
	case 1:
		cc.FilterSubject = c.FilterSubjects[0]
	default:
		cc.FilterSubjects = c.FilterSubjects
	}
	if err := receivesOwnDeadLetters(ctx, js, c); err != nil {
		return nil, err
	}
	// A dead-letter subject no stream captures holds every dead message
	// (its publish is retried until a stream does, the worker held):
	// said at once, not at the first poison message. Not refused: the
	// dead letters' stream may be created after the consumer.
	if _, err := js.StreamNameBySubject(ctx, c.DeadLetterSubject); err != nil {
		log.WarnContext(ctx, "natsjs: no stream captures the dead-letter subject: a dead message will be held (and its worker with it) until one does",
			"durable", c.Durable, "subject", c.DeadLetterSubject, "err", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: create consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	maxDeliver := max(c.MaxDeliver, 0)
	loop, err := inbox.NewConsumer(&inbox.ConsumerConfig{
		Process: p, MaxDeliver: maxDeliver, Heartbeat: c.AckWait / 3,
		Backoff: c.Backoff, DeriveFrom: c.DeriveFrom, Logger: log, Name: "natsjs",
	})
	if err != nil {
		return nil, err
	}
	return &Consumer{js: js, cc: cc, cons: cons, cfg: c, log: log, loop: loop}, nil
}

// receivesOwnDeadLetters refuses a dead-letter subject that the consumer
// would receive: each dead letter would come back to it as a new message
// (its Nats-Msg-Id is not copied), be handled, fail and be dead-lettered
// again, for ever.
func receivesOwnDeadLetters(ctx context.Context, js jetstream.JetStream, c Config) error {
	s, err := js.Stream(ctx, c.Stream)
	if err != nil {
		return fmt.Errorf("natsjs: create consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	info := s.CachedInfo()
	captured := false
	for _, p := range info.Config.Subjects {
		captured = captured || SubjectMatches(p, c.DeadLetterSubject)
	}
	received := captured
	if captured && len(c.FilterSubjects) > 0 {
		received = false
		for _, f := range c.FilterSubjects {
			received = received || SubjectMatches(f, c.DeadLetterSubject)
		}
	}
	if received {
		return fmt.Errorf("natsjs: NewConsumer: stream %s captures the dead-letter subject %q and the consumer %s would receive its own dead letters; choose a DeadLetterSubject outside the stream's subjects (default %q) or filter it out", c.Stream, c.DeadLetterSubject, c.Durable, DefaultDeadLetterPrefix+c.Stream+"."+c.Durable)
	}
	return nil
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
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for msg := range work {
				// The loop runs the Process without ctx's cancellation;
				// ctx's end stops only its retries.
				c.handle(ctx, msg)
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
		cc, err := cur.Consume(deliver, jetstream.PullMaxMessages(c.cfg.Prefetch), jetstream.PullExpiry(c.cfg.PullExpiry), jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
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
	m := message(msg)
	if m.ID == "" {
		meta, err := msg.Metadata()
		if err != nil {
			return m, fmt.Errorf("natsjs: message metadata: %w", err)
		}
		m.ID = seqID(meta)
	}
	return m, nil
}

// message is Message without the fallback ID.
func message(msg jetstream.Msg) inbox.Message {
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
	return m
}

// seqID is the ID of a message without one:
// "<stream>:<stream sequence>:<timestamp>", derived when longer than
// inbox.MaxIDLen (a stream name of over 200 bytes).
func seqID(meta *jetstream.MsgMetadata) string {
	seq, ts := strconv.FormatUint(meta.Sequence.Stream, 10), strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	id := meta.Stream + ":" + seq + ":" + ts
	if len(id) > inbox.MaxIDLen {
		id = inbox.DeriveID(meta.Stream, seq, ts)
	}
	return id
}

// handle runs one delivery through the consumer loop and reports it.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to ack.
		c.log.WarnContext(ctx, "natsjs: message without metadata", "subject", msg.Subject(), "err", err)
		return
	}
	d := &delivery{c: c, msg: msg, meta: meta}
	var ev Event
	if c.ownDeadLetter(msg) {
		// The stream's subjects changed after NewConsumer: never handle
		// a dead letter (it would be dead-lettered again, for ever).
		m, _ := Message(msg)
		ev = Event{Message: m, Sequence: meta.Sequence.Stream, Delivered: meta.NumDelivered, Action: Terminated}
		c.log.WarnContext(ctx, "natsjs: a dead letter of this consumer delivered to it; terminated", "durable", c.cfg.Durable, "subject", msg.Subject(), "seq", meta.Sequence.Stream)
		if err := d.Term(context.WithoutCancel(ctx), "a dead letter of this consumer"); err != nil {
			ev.Err = err
		}
	} else {
		s := c.loop.Settle(ctx, d)
		ev = Event{Message: s.Message, Sequence: meta.Sequence.Stream, Delivered: meta.NumDelivered,
			Outcome: s.Outcome, Action: s.Action, Err: s.Err, StoreErrors: s.StoreErrors}
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(ev)
	}
}

// ownDeadLetter reports whether msg is a dead letter this consumer
// published: by its subject alone. A dead letter that an operator
// published again on another subject, to retry it, keeps its Idem-Dead-*
// headers and is handled as any message (were it to die again, its new
// dead letter is one more, not a loop).
func (c *Consumer) ownDeadLetter(msg jetstream.Msg) bool {
	return msg.Subject() == c.cfg.DeadLetterSubject
}

// delivery is a JetStream message as the consumer loop settles it.
type delivery struct {
	c    *Consumer
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
}

var _ inbox.BrokerDelivery = (*delivery)(nil)

// Message is msg without the fallback ID: the loop derives one first.
func (d *delivery) Message() inbox.Message { return message(d.msg) }

// FallbackID is "<stream>:<stream sequence>:<timestamp>".
func (d *delivery) FallbackID() string { return seqID(d.meta) }

func (d *delivery) Delivered() int { return int(min(d.meta.NumDelivered, uint64(math.MaxInt32))) }

func (d *delivery) Ack(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, d.c.cfg.AckTimeout)
	defer cancel()
	return d.msg.DoubleAck(actx)
}

func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	return d.msg.NakWithDelay(delay)
}

func (d *delivery) InProgress(context.Context) error { return d.msg.InProgress() }

func (d *delivery) Term(_ context.Context, reason string) error {
	if termReasonSupported(d.c.js.Conn().ConnectedServerVersion()) {
		return d.msg.TermWithReason(reason)
	}
	return d.msg.Term()
}

// DeadLetter publishes msg to the dead-letter subject, awaiting the
// stream's confirmation.
func (d *delivery) DeadLetter(ctx context.Context, reason string, o inbox.Outcome) error {
	c, msg, meta := d.c, d.msg, d.meta
	dl := nats.NewMsg(c.cfg.DeadLetterSubject)
	dl.Data = msg.Data()
	for k, v := range msg.Headers() {
		if strings.HasPrefix(k, "Nats-") {
			continue // Nats-Msg-Id and the expectations belong to the original
		}
		dl.Header[k] = v
	}
	id := o.ID
	if id == "" {
		id = seqID(meta)
	}
	dl.Header.Set(DeadReasonHeader, reason)
	dl.Header.Set(DeadIDHeader, id)
	dl.Header.Set(DeadSubjectHeader, msg.Subject())
	dl.Header.Set(DeadStreamHeader, meta.Stream)
	dl.Header.Set(DeadSequenceHeader, strconv.FormatUint(meta.Sequence.Stream, 10))
	dl.Header.Set(DeadConsumerHeader, c.cfg.Durable)
	dl.Header.Set(DeadDeliveriesHeader, strconv.FormatUint(meta.NumDelivered, 10))
	pctx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
	defer cancel()
	// A dead letter published again (the consumer died before Term) is
	// dropped by the dead-letter stream's duplicate window.
	_, err := c.js.PublishMsg(pctx, dl, jetstream.WithMsgID(deadLetterID(meta, c.cfg.Durable)))
	return err
}

// deadLetterID is the Nats-Msg-Id of the dead letter of the message at
// meta: its stream, durable, sequence and the stream's timestamp of the
// message (a stream deleted and created again numbers from 1 again: the
// timestamp tells its lives apart), derived when longer than
// inbox.MaxIDLen.
func deadLetterID(meta *jetstream.MsgMetadata, durable string) string {
	seq, ts := strconv.FormatUint(meta.Sequence.Stream, 10), strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	id := "dead:" + meta.Stream + ":" + durable + ":" + seq + ":" + ts
	if len(id) > inbox.MaxIDLen {
		id = inbox.DeriveID("dead", meta.Stream, durable, seq, ts)
	}
	return id
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
