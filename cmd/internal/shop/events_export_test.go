package shop

import (
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

// BrokerNames returns what shopd declares on the broker under -events
// name: the NATS streams, the AMQP exchange and the AMQP queues (a test
// deletes them when it ends).
func BrokerNames(name string) (streams []string, exchange string, queues []string) {
	n := newTopology(name)
	return []string{n.stream, n.deadStream}, n.exchange, []string{n.queue, n.deadQueue}
}

// SetAfterPublish makes the relays of this process call f after the broker
// confirmed an event and before the relay marks it sent. Set it before
// shopd starts (a test binary's shopd child).
func SetAfterPublish(f func(outbox.Message)) { afterPublishHook = f }

// SetLoyaltyHook makes the loyalty consumers of this process call f after
// handling a message (its effect committed when the result is Processed)
// and before it is acked. Set it before shopd starts.
func SetLoyaltyHook(f func(inbox.Message, inbox.Outcome)) { loyaltyHook = f }

// SetNATSAckWait sets the loyalty durable's AckWait (0: natsjs's default).
// Set it before shopd starts.
func SetNATSAckWait(d time.Duration) { natsAckWait = d }

// SetLoyaltyFailure makes the loyalty consumers of this process fail
// every attempt at an event for which f returns an error. Set it before
// shopd starts.
func SetLoyaltyFailure(f func(ev OrderEvent) error) { loyaltyFailHook = f }
