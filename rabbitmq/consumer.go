package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
)

// Defaults of ConsumerConfig.
const (
	DefaultPrefetch       = 32
	DefaultWorkers        = 1
	DefaultMaxRetryDelay  = 10 * time.Second
	DefaultReconnectDelay = time.Second
	DefaultMaxReconnect   = 30 * time.Second
)

// Headers the consumer adds to a Message (and to a dead-lettered
// message). They are recorded for the handler and the logs, and never
// used to decide whether a message is a duplicate: that is the inbox's
// record's alone.
const (
	// HeaderRedelivered is "true" when the broker set the delivery's
	// redelivered flag (it delivered the message before, to this consumer
	// or another; the earlier delivery may or may not have been handled),
	// "false" otherwise.
	HeaderRedelivered = "amqp-redelivered"
	// HeaderDeliveryCount is the quorum queue's x-delivery-count (the
	// number of earlier failed deliveries), copied when the broker sent
	// one. Classic queues send none.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderKey carries outbox.Message.Key (the Publisher sets it; the
	// consumer maps it to inbox.Message.Key).
	HeaderKey = "idem-key"
	// HeaderDeadReason is the reason a dead-lettered message is dead:
	// the handler's last error, or the inbox's (ErrNoID for a message
	// without a message_id).
	HeaderDeadReason = "idem-dead-reason"
	// HeaderDeadAttempts is the number of attempts the record counted.
	HeaderDeadAttempts = "idem-dead-attempts"
	// HeaderDeadQueue is the queue it was consumed from.
	HeaderDeadQueue = "idem-dead-queue"
)

// HandleFunc handles one message and says what to do with the delivery:
// an inbox's HandleTx or Handle, through HandleTx and Handle below, or a
// function of the caller's that calls one of them. A non-nil error is the
// store's: the consumer keeps the delivery and calls it again after a
// backoff (inbox.Consumer).
type HandleFunc = inbox.Process

// HandleTx returns a HandleFunc that handles each message with
// in.HandleTx(ctx, db, m, h): the effect and the consume record commit in
// one transaction, and the delivery is acked only after that commit.
func HandleTx(in *inbox.Inbox, db inbox.Beginner, h inbox.TxHandler) HandleFunc {
	return in.ProcessTx(db, h)
}

// Handle returns a HandleFunc that handles each message with
// in.Handle(ctx, m, h), the external-effect mode.
func Handle(in *inbox.Inbox, h inbox.Handler) HandleFunc { return in.Process(h) }

// ConsumerConfig configures a Consumer. Zero values mean the defaults;
// URL and Queue are required.
type ConsumerConfig struct {
	// URL is the broker's AMQP URL (amqp://user:pass@host:port/vhost).
	// Required.
	URL string
	// AMQP is passed to amqp.DialConfig (TLS, heartbeat, properties).
	// Zero: the client's defaults.
	AMQP amqp.Config
	// Queue is the queue consumed. Required. It must exist, or Setup
	// must declare it.
	Queue string
	// Setup, if set, runs on every new channel before consuming (after
	// every reconnection): declare the queue, the exchanges and bindings
	// there. An error or a panic ends the session, which is retried.
	Setup func(ch *amqp.Channel) error
	// ConsumerTag names the consumer on the broker. Default: the
	// broker's generated tag.
	ConsumerTag string
	// Prefetch is the channel's QoS prefetch count: the most deliveries
	// unacked at once, including those waiting for a delayed requeue.
	// Default 32.
	Prefetch int
	// Workers is the number of goroutines that handle deliveries. Default
	// 1. With more than one, messages are handled out of queue order.
	Workers int
	// DeadLetterExchange and DeadLetterRoutingKey are where a dead
	// message is published (with HeaderDeadReason and the other
	// HeaderDead headers, under publisher confirms) before its delivery
	// is acked. The default exchange "" with a routing key naming a
	// queue delivers to that queue. Both empty: a dead message is
	// rejected without requeue instead, so that the queue's own
	// x-dead-letter-exchange, if set, receives it (with the broker's
	// x-death header, but without the reason); without one the broker
	// drops it. A dead-letter publish that fails (no queue takes it, the
	// broker nacks it) is retried with Backoff while the delivery is
	// held, unacked; the session's end requeues it.
	DeadLetterExchange   string
	DeadLetterRoutingKey string
	// MaxRetryDelay bounds how long the consumer waits before it requeues
	// a delivery whose Outcome is Retry or InProgress (RabbitMQ has no
	// delayed negative ack: the delivery stays unacked, holding a
	// prefetch slot, for min(Outcome.Delay, MaxRetryDelay), and is then
	// nacked with requeue). Default 10 s.
	MaxRetryDelay time.Duration
	// ReconnectDelay is the first wait before reconnecting after the
	// connection or the channel dropped; it doubles up to MaxReconnect
	// while reconnections fail. Defaults 1 s and 30 s.
	ReconnectDelay time.Duration
	MaxReconnect   time.Duration
	// MaxDeliver is the most deliveries of a message, by a quorum
	// queue's x-delivery-count, after which a delivery that would be
	// requeued with a Retry is dead-lettered instead (an InProgress is
	// requeued: the lease's holder settles it; a first delivery, not flagged
	// redelivered, is the 1st). 0: none (classic queues count no
	// redeliveries; the inbox's MaxAttempts decides).
	MaxDeliver int
	// DeriveFrom, when a message has no message_id, names the fields its
	// ID is derived from (inbox.DeriveID): its business number, event
	// type and version (see inbox.ConsumerConfig.DeriveFrom). Nil: such
	// a message is dead (inbox.ErrNoID).
	DeriveFrom func(m inbox.Message) []string
	// Backoff is the wait before the n-th retry of a store error or of
	// a dead-letter publish (the delivery is kept meanwhile). Default
	// inbox.DefaultBackoff: from 100 ms, doubling, to 10 s.
	Backoff func(n int) time.Duration
	// Observe, if set, is called after each delivery is settled, from
	// the worker that handled it.
	Observe func(inbox.Settled)
	// Logger receives deliveries that are not acked, broker failures and
	// reconnections. Nil: discarded. A line identifies its message by
	// idem.key_hash (idem.HashKey("", the message ID), as the inbox's
	// Observer events do), never by its ID.
	Logger *slog.Logger
}

// Consumer consumes a queue with manual acks and hands each delivery to
// the inbox's consumer loop (inbox.Consumer), which maps its Outcome to
// the broker: Processed and Duplicate → ack; Retry and InProgress → nack
// with requeue after the Outcome's Delay (bounded); Dead → dead-letter,
// then ack; a store error or a panic never ends it. It reconnects when the connection or the
// channel drops, and when the broker cancels its consumer (the queue was
// deleted: Setup may declare it again).
type Consumer struct {
	cfg  ConsumerConfig
	loop *inbox.Consumer
	log  *slog.Logger
}

// NewConsumer returns a Consumer of cfg.Queue whose deliveries h handles.
// cfg is copied.
func NewConsumer(cfg *ConsumerConfig, h HandleFunc) (*Consumer, error) {
	if cfg == nil || cfg.URL == "" || cfg.Queue == "" {
		return nil, errors.New("rabbitmq: NewConsumer needs a URL and a Queue")
	}
	if h == nil {
		return nil, errors.New("rabbitmq: NewConsumer needs a HandleFunc")
	}
	c := *cfg
	if c.Prefetch < 0 || c.Workers < 0 || c.MaxDeliver < 0 || c.MaxRetryDelay < 0 || c.ReconnectDelay < 0 || c.MaxReconnect < 0 {
		return nil, fmt.Errorf("rabbitmq: NewConsumer: negative setting")
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = DefaultReconnectDelay
	}
	if c.MaxReconnect == 0 {
		c.MaxReconnect = DefaultMaxReconnect
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	loop, err := inbox.NewConsumer(&inbox.ConsumerConfig{
		Process: h, MaxDeliver: c.MaxDeliver, Backoff: c.Backoff, DeriveFrom: c.DeriveFrom, Logger: log, Name: "rabbitmq",
	})
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: c, loop: loop, log: log}, nil
}

// Run consumes until ctx ends, reconnecting after every failure, and then
// returns nil once the handlers in flight have finished (they run under a
// context that ctx's end does not cancel, so that a shutdown does not
// count as a failed attempt). Unacked deliveries return to the queue when
// the channel closes.
func (c *Consumer) Run(ctx context.Context) error {
	delay := c.cfg.ReconnectDelay
	for {
		started := time.Now()
		err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > c.cfg.MaxReconnect {
			delay = c.cfg.ReconnectDelay // the session ran well: start over
		}
		c.log.WarnContext(ctx, "rabbitmq: consumer session ended; reconnecting",
			slog.String("queue", c.cfg.Queue), slog.Any("err", err), slog.Duration("delay", delay))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, c.cfg.MaxReconnect)
	}
}

// session runs one connection: it returns when the connection or the
// channel drops, or ctx ends.
func (c *Consumer) session(ctx context.Context) error {
	conn, err := amqp.DialConfig(c.cfg.URL, c.cfg.AMQP)
	if err != nil {
		return fmt.Errorf("rabbitmq: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("rabbitmq: qos: %w", err)
	}
	if err := c.setup(ch); err != nil {
		return err
	}
	var dl *confirmer
	if c.cfg.DeadLetterExchange != "" || c.cfg.DeadLetterRoutingKey != "" {
		dch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: dead-letter channel: %w", err)
		}
		if dl, err = newConfirmer(dch); err != nil {
			return fmt.Errorf("rabbitmq: dead-letter channel: %w", err)
		}
	}
	deliveries, err := ch.Consume(c.cfg.Queue, c.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitmq: consume %s: %w", c.cfg.Queue, err)
	}
	c.log.InfoContext(ctx, "rabbitmq: consuming", slog.String("queue", c.cfg.Queue),
		slog.Int("prefetch", c.cfg.Prefetch), slog.Int("workers", c.cfg.Workers))
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	// The broker cancels the consumer (basic.cancel) and keeps the
	// channel open when the queue is deleted: deliveries then end, and
	// only a new session (whose Setup may declare the queue again)
	// consumes again.
	cancelled := ch.NotifyCancel(make(chan string, 1))

	// sctx ends with the session; handlers run without its cancellation.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-sctx.Done():
					return
				case d, ok := <-deliveries:
					if !ok {
						return
					}
					c.deliver(sctx, &wg, dl, d)
				}
			}
		})
	}
	var cause error
	select {
	case <-ctx.Done():
	case e := <-closed:
		cause = fmt.Errorf("rabbitmq: connection closed: %w", amqpErr(e))
	case e := <-chClosed:
		cause = fmt.Errorf("rabbitmq: channel closed: %w", amqpErr(e))
	case tag, ok := <-cancelled:
		if !ok { // closed with the channel
			cause = fmt.Errorf("rabbitmq: channel closed: %w", amqp.ErrClosed)
			break
		}
		cause = fmt.Errorf("rabbitmq: the broker cancelled consumer %q of %s (queue deleted?)", tag, c.cfg.Queue)
	}
	cancel()
	wg.Wait() // handlers in flight finish; their acks go out if the channel lives
	return cause
}

// setup runs Setup on ch; its panic is an error, as its failure is: the
// session ends and is retried.
func (c *Consumer) setup(ch *amqp.Channel) (err error) {
	if c.cfg.Setup == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rabbitmq: setup panicked: %v", r)
		}
	}()
	if err := c.cfg.Setup(ch); err != nil {
		return fmt.Errorf("rabbitmq: setup: %w", err)
	}
	return nil
}

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
	}
	return e
}

// deliver runs one delivery through the consumer loop. Delayed
// requeues run in goroutines of wg, which end early (requeueing at once)
// when sctx ends.
func (c *Consumer) deliver(sctx context.Context, wg *sync.WaitGroup, dl *confirmer, d amqp.Delivery) {
	st := c.loop.Settle(sctx, &delivery{c: c, sctx: sctx, wg: wg, dl: dl, d: d})
	if c.cfg.Observe != nil {
		c.cfg.Observe(st)
	}
}

// delivery is an AMQP delivery as the consumer loop settles it.
type delivery struct {
	c    *Consumer
	sctx context.Context
	wg   *sync.WaitGroup
	dl   *confirmer
	d    amqp.Delivery
}

var _ inbox.BrokerDelivery = (*delivery)(nil)

func (d *delivery) Message() inbox.Message { return message(d.d) }

// FallbackID is none: a message without message_id is the inbox's
// (DeriveFrom, or ErrNoID).
func (d *delivery) FallbackID() string { return "" }

// Delivered is 1 + a quorum queue's x-delivery-count; 1 for a delivery
// not flagged redelivered (a quorum queue's first carries no count); 0
// (unknown) for a classic queue's redelivery.
func (d *delivery) Delivered() int {
	switch n := d.d.Headers[HeaderDeliveryCount].(type) {
	case int64:
		return int(n) + 1
	case int32:
		return int(n) + 1
	case int:
		return n + 1
	}
	if !d.d.Redelivered {
		return 1
	}
	return 0
}

func (d *delivery) Ack(context.Context) error { return d.d.Ack(false) }

// InProgress is a no-op: RabbitMQ has no ack deadline but its consumer
// timeout (30 min by default).
func (d *delivery) InProgress(context.Context) error { return nil }

// Nak requeues the delivery after min(delay, MaxRetryDelay): RabbitMQ
// has no delayed nack, so it stays unacked meanwhile (holding a prefetch
// slot, not a worker), in a goroutine that requeues at once when the
// session ends.
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	delay = min(max(delay, 0), d.c.cfg.MaxRetryDelay)
	if delay <= 0 {
		return d.d.Nack(false, true)
	}
	d.wg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.sctx.Done():
		}
		if err := d.d.Nack(false, true); err != nil {
			d.c.log.DebugContext(d.sctx, "rabbitmq: nack failed (the channel's close requeues it)", slog.String("queue", d.c.cfg.Queue), slog.Any("err", err))
		}
	})
	return nil
}

// Term acks a dead-lettered delivery; without a dead-letter exchange it
// rejects it without requeue, for the queue's own x-dead-letter-exchange.
func (d *delivery) Term(context.Context, string) error {
	if d.dl == nil {
		return d.d.Reject(false)
	}
	return d.d.Ack(false)
}

// DeadLetter publishes the delivery to the dead-letter exchange with the
// reason, and waits for the broker's confirm; without a dead-letter
// exchange it does nothing (Term rejects the delivery).
func (d *delivery) DeadLetter(ctx context.Context, reason string, o inbox.Outcome) error {
	if d.dl == nil {
		return nil
	}
	c, dd := d.c, d.d
	h := amqp.Table{}
	for k, v := range dd.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = reason
	h[HeaderDeadAttempts] = int64(o.Attempt)
	h[HeaderDeadQueue] = c.cfg.Queue
	p := amqp.Publishing{
		Headers: h, ContentType: dd.ContentType, ContentEncoding: dd.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: dd.Priority, CorrelationId: dd.CorrelationId,
		ReplyTo: dd.ReplyTo, MessageId: dd.MessageId, Timestamp: dd.Timestamp, Type: dd.Type,
		AppId: dd.AppId, Body: dd.Body,
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return d.dl.publish(pctx, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, true, p)
}

// message maps a delivery to an inbox.Message: ID from message_id, Topic
// from the routing key, Key from HeaderKey, the headers as strings with
// HeaderRedelivered added.
func message(d amqp.Delivery) inbox.Message {
	h := make(map[string]string, len(d.Headers)+1)
	for k, v := range d.Headers {
		h[k] = headerString(v)
	}
	h[HeaderRedelivered] = strconv.FormatBool(d.Redelivered)
	return inbox.Message{ID: d.MessageId, Topic: d.RoutingKey, Key: h[HeaderKey], Headers: h, Payload: d.Body}
}

// headerString renders an AMQP table value as a string.
func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	default:
		return fmt.Sprint(v)
	}
}

// confirmer publishes on a channel in confirm mode, one message at a
// time, and reports the broker's answer.
type confirmer struct {
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
}

func newConfirmer(ch *amqp.Channel) (*confirmer, error) {
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, err
	}
	// Buffered: the client's reader goroutine hands a basic.return over
	// before the basic.ack of the same message, and must not block.
	r := ch.NotifyReturn(make(chan amqp.Return, 16))
	return &confirmer{ch: ch, returns: r}, nil
}

// publish sends p and waits for the broker's confirm: nil after an ack;
// ErrNacked after a nack; ErrUnroutable when mandatory and the message
// was returned.
func (c *confirmer) publish(ctx context.Context, exchange, key string, mandatory bool, p amqp.Publishing) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.returns) > 0 { // stale returns of earlier, failed publishes
		<-c.returns
	}
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, p)
	if err != nil {
		return err
	}
	ack, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ack {
		if c.ch.IsClosed() {
			return fmt.Errorf("%w: %w", ErrNotConfirmed, amqp.ErrClosed)
		}
		return ErrNacked
	}
	select {
	case r := <-c.returns:
		return &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, Code: r.ReplyCode, Text: r.ReplyText}
	default:
		return nil
	}
}
