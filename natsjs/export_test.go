package natsjs

import "github.com/idemkit/idem/inbox"

// SetBeforeSettle sets a hook run after the process returned and before
// its outcome is acted on (the ack, the nak, the dead letter).
func SetBeforeSettle(c *Consumer, f func(inbox.Message, inbox.Outcome)) { c.beforeSettle = f }
