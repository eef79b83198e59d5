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

	"github.com/idemkit/idem"
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
// store's: the delivery is requeued after the Outcome's Delay.
type HandleFunc func(ctx context.Context, m inbox.Message) (inbox.Outcome, error)

// HandleTx returns a HandleFunc that handles each message with
// in.HandleTx(ctx, db, m, h): the effect and the consume record commit in
// one transaction, and the delivery is acked only after that commit.
func HandleTx(in *inbox.Inbox, db inbox.Beginner, h inbox.TxHandler) HandleFunc {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		return in.HandleTx(ctx, db, m, h)
	}
}

// Handle returns a HandleFunc that handles each message with
// in.Handle(ctx, m, h), the external-effect mode.
func Handle(in *inbox.Inbox, h inbox.Handler) HandleFunc {
	return func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		return in.Handle(ctx, m, h)
	}
}

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
	// there. An error ends the session, which is retried.
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
	// broker nacks it) leaves the delivery unacked for MaxRetryDelay,
	// and it is then requeued.
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
	// Logger receives deliveries that are not acked, broker failures and
	// reconnections. Nil: discarded. A line identifies its message by
	// idem.key_hash (idem.HashKey("", the message ID), as the inbox's
	// Observer events do), never by its ID.
	Logger *slog.Logger
}

// Consumer consumes a queue with manual acks and maps each delivery's
// Outcome to the broker: Processed and Duplicate → ack; Retry and
// InProgress → nack with requeue after the Outcome's Delay (bounded);
// Dead → dead-letter, then ack. It reconnects when the connection or the
// channel drops, and when the broker cancels its consumer (the queue was
// deleted: Setup may declare it again).
type Consumer struct {
	cfg    ConsumerConfig
	handle HandleFunc
	log    *slog.Logger
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
	if c.Prefetch < 0 || c.Workers < 0 || c.MaxRetryDelay < 0 || c.ReconnectDelay < 0 || c.MaxReconnect < 0 {
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
	return &Consumer{cfg: c, handle: h, log: log}, nil
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
	if c.cfg.Setup != nil {
		if err := c.cfg.Setup(ch); err != nil {
			return fmt.Errorf("rabbitmq: setup: %w", err)
		}
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

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
	}
	return e
}

// deliver handles one delivery and settles it. Delayed requeues run in
// goroutines of wg, which end early (requeueing at once) when sctx ends.
func (c *Consumer) deliver(sctx context.Context, wg *sync.WaitGroup, dl *confirmer, d amqp.Delivery) {
	m := message(d)
	o, err := c.handle(context.WithoutCancel(sctx), m)
	attrs := []any{
		slog.String("queue", c.cfg.Queue), idem.LogKey("", d.MessageId, false),
		slog.Bool("redelivered", d.Redelivered), slog.String("delivery_count", m.Headers[HeaderDeliveryCount]),
		slog.String("result", o.Result.String()), slog.Int("attempt", o.Attempt),
	}
	if err != nil {
		c.log.WarnContext(sctx, "rabbitmq: store failed; requeueing", append(attrs, slog.Any("err", err))...)
		if o.Result != inbox.Retry && o.Result != inbox.InProgress {
			o.Result = inbox.Retry
		}
		if o.Delay <= 0 {
			o.Delay = time.Second
		}
	}
	switch o.Result {
	case inbox.Processed, inbox.Duplicate:
		if err := d.Ack(false); err != nil {
			// The broker requeues it when the channel closes; the inbox
			// answers Duplicate then.
			c.log.WarnContext(sctx, "rabbitmq: ack failed", append(attrs, slog.Any("err", err))...)
		}
	case inbox.Dead:
		if !c.deadLetter(sctx, dl, d, o, attrs) {
			// Requeued after MaxRetryDelay: at once, the redelivery
			// would fail the same way, as fast as the broker answers.
			c.requeue(sctx, wg, d, c.cfg.MaxRetryDelay, attrs)
		}
	default: // Retry, InProgress, or an unknown result: requeue later
		delay := min(max(o.Delay, 0), c.cfg.MaxRetryDelay)
		c.log.InfoContext(sctx, "rabbitmq: requeueing", append(attrs, slog.Duration("delay", delay), slog.Any("reason", o.Err))...)
		c.requeue(sctx, wg, d, delay, attrs)
	}
}

// requeue nacks d with requeue after delay, in a goroutine of wg that
// nacks at once when sctx ends.
func (c *Consumer) requeue(sctx context.Context, wg *sync.WaitGroup, d amqp.Delivery, delay time.Duration, attrs []any) {
	if delay <= 0 {
		c.nack(sctx, d, attrs)
		return
	}
	wg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-sctx.Done():
		}
		c.nack(sctx, d, attrs)
	})
}

func (c *Consumer) nack(ctx context.Context, d amqp.Delivery, attrs []any) {
	if err := d.Nack(false, true); err != nil {
		c.log.DebugContext(ctx, "rabbitmq: nack failed (the channel's close requeues it)", append(attrs, slog.Any("err", err))...)
	}
}

// deadLetter publishes d to the dead-letter exchange with the reason,
// waits for the broker's confirm and acks d; without a dead-letter
// exchange it rejects d without requeue. It reports false if the publish
// failed: d is then the caller's to requeue (the inbox answers Dead again
// on its redelivery, and it is dead-lettered then).
func (c *Consumer) deadLetter(ctx context.Context, dl *confirmer, d amqp.Delivery, o inbox.Outcome, attrs []any) bool {
	reason := "dead"
	if o.Err != nil {
		reason = o.Err.Error()
	}
	attrs = append(attrs, slog.String("reason", reason))
	if dl == nil {
		c.log.WarnContext(ctx, "rabbitmq: dead message rejected", attrs...)
		if err := d.Reject(false); err != nil {
			c.log.WarnContext(ctx, "rabbitmq: reject failed", append(attrs, slog.Any("err", err))...)
		}
		return true
	}
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = reason
	h[HeaderDeadAttempts] = int64(o.Attempt)
	h[HeaderDeadQueue] = c.cfg.Queue
	p := amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type,
		AppId: d.AppId, Body: d.Body,
	}
	// A dead message must not be lost: the publish is bounded but not
	// cancelled by the session's end.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := dl.publish(pctx, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, true, p); err != nil {
		c.log.WarnContext(ctx, "rabbitmq: dead-letter publish failed; requeueing", append(attrs, slog.Any("err", err), slog.Duration("delay", c.cfg.MaxRetryDelay))...)
		return false
	}
	c.log.WarnContext(ctx, "rabbitmq: dead message dead-lettered", attrs...)
	if err := d.Ack(false); err != nil {
		c.log.WarnContext(ctx, "rabbitmq: ack of a dead-lettered message failed (it may be dead-lettered twice)", append(attrs, slog.Any("err", err))...)
	}
	return true
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
