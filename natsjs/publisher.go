package natsjs

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoID is returned by Publisher.Publish for a message without an ID:
// it could not be de-duplicated, by the stream or by a consumer's inbox.
var ErrNoID = errors.New("natsjs: message without an ID")

// PublisherConfig configures a Publisher. Nil or the zero value means the
// defaults.
type PublisherConfig struct {
	// Subject maps a message to the subject it is published on. Default:
	// its Topic.
	Subject func(outbox.Message) string
	// Stream, if set, is the stream the message must land in
	// (Nats-Expected-Stream): a subject captured by another stream, or
	// by none, is an error instead of a message in the wrong place.
	Stream string
}

// Publisher publishes outbox messages to JetStream: it is an
// outbox.Publisher for outbox.Relay. The message's ID is sent as
// Nats-Msg-Id, its Key as the Idem-Key header, its headers as headers;
// Publish returns nil only after the stream's PubAck.
type Publisher struct {
	js  jetstream.JetStream
	cfg PublisherConfig
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on js. cfg is copied; nil means the
// defaults.
func NewPublisher(js jetstream.JetStream, cfg *PublisherConfig) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("natsjs: NewPublisher needs a JetStream")
	}
	var c PublisherConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Subject == nil {
		c.Subject = func(m outbox.Message) string { return m.Topic }
	}
	return &Publisher{js: js, cfg: c}, nil
}

// Publish publishes msg and waits for the stream's PubAck (bounded by
// ctx, or by the JetStream context's default timeout, 5 s, when ctx has
// no deadline). A message the stream already holds under msg.ID, within
// its Duplicates window, is acknowledged as a duplicate and not stored
// again: that is a success. Any other failure leaves the message pending
// in the outbox, to be published again with the same ID.
func (p *Publisher) Publish(ctx context.Context, msg outbox.Message) error {
	if msg.ID == "" {
		return ErrNoID
	}
	subject := p.cfg.Subject(msg)
	if subject == "" {
		return fmt.Errorf("natsjs: message %s maps to no subject", msg.ID)
	}
	m := nats.NewMsg(subject)
	m.Data = msg.Payload
	for k, v := range msg.Headers {
		m.Header.Set(k, v)
	}
	if msg.Key != "" {
		m.Header.Set(KeyHeader, msg.Key)
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(msg.ID)}
	if p.cfg.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(p.cfg.Stream))
	}
	if _, err := p.js.PublishMsg(ctx, m, opts...); err != nil {
		return fmt.Errorf("natsjs: publish %s to %s: %w", msg.ID, subject, err)
	}
	return nil
}
