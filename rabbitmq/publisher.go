package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/outbox"
)

var (
	// ErrNacked is returned by Publisher.Publish when the broker answered
	// the publish with a negative confirm (basic.nack: a queue refused
	// it, e.g. x-overflow reject-publish, or an internal error). The
	// relay keeps the message pending and publishes it again.
	ErrNacked = errors.New("rabbitmq: the broker nacked the message")
	// ErrNotConfirmed is wrapped by the error of a publish whose channel
	// closed before the broker confirmed it: the broker may or may not
	// have it, and it is published again (with the same message_id).
	ErrNotConfirmed = errors.New("rabbitmq: the channel closed before the broker confirmed")
)

// UnroutableError is returned by Publisher.Publish when the broker
// returned a mandatory message (basic.return): no queue is bound to take
// it.
type UnroutableError struct {
	Exchange, RoutingKey string
	Code                 uint16
	Text                 string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("rabbitmq: unroutable: exchange %q, routing key %q: %d %s", e.Exchange, e.RoutingKey, e.Code, e.Text)
}

// PublisherConfig configures a Publisher. URL is required.
type PublisherConfig struct {
	// URL is the broker's AMQP URL. Required.
	URL string
	// AMQP is passed to amqp.DialConfig. Zero: the client's defaults.
	AMQP amqp.Config
	// Exchange receives every message, with the message's Topic as the
	// routing key. Default "": the default exchange, where the Topic
	// names a queue.
	Exchange string
	// Setup, if set, runs on every new channel before its first publish
	// (after every reconnection): declare the exchange there.
	Setup func(ch *amqp.Channel) error
	// AllowUnroutable publishes without the mandatory flag: a message no
	// queue takes is confirmed by the broker and dropped. Default false:
	// mandatory, and a returned message is an *UnroutableError, so the
	// relay keeps it pending until a queue is bound.
	AllowUnroutable bool
	// Timeout bounds one publish and its confirm when the caller's
	// context has no earlier deadline. Default 30 s.
	Timeout time.Duration
}

// Publisher publishes outbox messages to RabbitMQ under publisher
// confirms: the outbox.Publisher of a Relay. Publish returns nil only
// after the broker acked the message. It is safe for concurrent use;
// publishes go out one at a time on one channel, each waiting for its
// confirm. It dials on the first Publish, and again on the next Publish
// after the connection or the channel dropped.
type Publisher struct {
	cfg PublisherConfig

	mu   sync.Mutex
	conn *amqp.Connection
	c    *confirmer
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher; it does not dial until the first
// Publish. cfg is copied.
func NewPublisher(cfg *PublisherConfig) (*Publisher, error) {
	if cfg == nil || cfg.URL == "" {
		return nil, errors.New("rabbitmq: NewPublisher needs a URL")
	}
	c := *cfg
	if c.Timeout < 0 {
		return nil, fmt.Errorf("rabbitmq: NewPublisher: negative Timeout %v", c.Timeout)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	return &Publisher{cfg: c}, nil
}

// Publish sends msg to the exchange with msg.Topic as the routing key,
// msg.ID as the AMQP message_id, msg.Headers as headers (and msg.Key as
// HeaderKey), persistent, and waits for the broker's confirm: nil after
// its ack; ErrNacked after a nack; an *UnroutableError when no queue took
// a mandatory message; a wrapped ErrNotConfirmed or a connection error
// when the channel dropped (the next Publish reconnects).
func (p *Publisher) Publish(ctx context.Context, msg outbox.Message) error {
	if msg.ID == "" {
		return errors.New("rabbitmq: Publish: message without an ID")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	var h amqp.Table
	if len(msg.Headers) > 0 || msg.Key != "" {
		h = make(amqp.Table, len(msg.Headers)+1)
		for k, v := range msg.Headers {
			h[k] = v
		}
		if msg.Key != "" {
			h[HeaderKey] = msg.Key
		}
	}
	pub := amqp.Publishing{
		Headers: h, MessageId: msg.ID, DeliveryMode: amqp.Persistent, Body: msg.Payload,
	}
	if !msg.CreatedAt.IsZero() {
		pub.Timestamp = msg.CreatedAt
	}
	c, err := p.channel()
	if err != nil {
		return err
	}
	err = c.publish(ctx, p.cfg.Exchange, msg.Topic, !p.cfg.AllowUnroutable, pub)
	if err != nil && (c.ch.IsClosed() || errors.Is(err, amqp.ErrClosed)) {
		p.drop(c)
	}
	return err
}

// channel returns the live confirm channel, dialing if needed.
func (p *Publisher) channel() (*confirmer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil && !p.c.ch.IsClosed() && p.conn != nil && !p.conn.IsClosed() {
		return p.c, nil
	}
	p.closeLocked()
	conn, err := amqp.DialConfig(p.cfg.URL, p.cfg.AMQP)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: dial: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rabbitmq: channel: %w", err)
	}
	if p.cfg.Setup != nil {
		if err := p.cfg.Setup(ch); err != nil {
			conn.Close()
			return nil, fmt.Errorf("rabbitmq: setup: %w", err)
		}
	}
	c, err := newConfirmer(ch)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	p.conn, p.c = conn, c
	return c, nil
}

// drop forgets c's connection after a failure, so the next Publish dials.
func (p *Publisher) drop(c *confirmer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == c {
		p.closeLocked()
	}
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.c = nil, nil
}

// Close closes the publisher's connection. A later Publish dials again.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return nil
}
