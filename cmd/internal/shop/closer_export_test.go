package shop

// SetBeforeClose makes c call f in its passes before each close
// transaction, with the order's number: a test pauses a pass there.
func SetBeforeClose(c *Closer, f func(orderNo string)) { c.beforeClose = f }
