package admin

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The login limits (see the package doc, Access).
const (
	// freeFailures is how many failed logins in a row a client makes
	// before each further one locks it out.
	freeFailures = 5
	// firstDelay is the first lockout; each further failure doubles it,
	// up to maxDelay.
	firstDelay = time.Second
	maxDelay   = 5 * time.Minute
	// forgetAfter is how long a client's failures are kept after its
	// last one.
	forgetAfter = time.Hour
	// maxClients bounds the clients whose failures are kept: past it,
	// the one whose last failure is the oldest is forgotten.
	maxClients = 1024
	// globalFailures is how many failed logins, of all clients, a
	// minute (globalWindow) allows: past it every login is refused until
	// the minute ends.
	globalFailures = 30
	globalWindow   = time.Minute
)

// limiter counts failed token checks by client and overall, and refuses
// the checks of a client, or of everyone, past the limits.
type limiter struct {
	mu      sync.Mutex
	clients map[string]*list.Element // of *client
	order   list.List                // of *client, oldest last failure first

	// The global window: failures since windowStart.
	windowStart time.Time
	windowFails int
	// windowLogged: the window's refusals were logged.
	windowLogged bool
}

// client is one client's consecutive failures.
type client struct {
	key   string
	fails int
	last  time.Time
	// until is the end of its lockout (zero: none).
	until time.Time
	// logged: a refusal in this lockout was logged.
	logged bool
}

// refusal is a refused check: how long to wait, and whether it is the
// first of its lockout (to be logged) and whose (global: everyone's).
type refusal struct {
	wait   time.Duration
	log    bool
	global bool
}

// clientKey is who a request comes from: the IP of its connection's
// remote address (an IPv6 address by its /64, which one subscriber
// usually holds whole). Forwarding headers are not trusted: they are
// the client's to forge.
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// check decides a token check of key at now whose result is ok: a
// refusal when key or everyone is locked out (whatever ok is), else it
// counts the result. Deciding and counting under one lock, concurrent
// attempts of one client cannot all pass before the first failure is
// counted.
func (l *limiter) check(key string, now time.Time, ok bool) (refusal, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients == nil {
		l.clients = map[string]*list.Element{}
	}
	l.forget(now)
	if !now.Before(l.windowStart.Add(globalWindow)) {
		l.windowStart, l.windowFails, l.windowLogged = now, 0, false
	}
	var c *client
	if e := l.clients[key]; e != nil {
		c = e.Value.(*client)
	}
	if c != nil && now.Before(c.until) {
		r := refusal{wait: c.until.Sub(now), log: !c.logged}
		c.logged = true
		return r, false
	}
	if l.windowFails >= globalFailures {
		r := refusal{wait: l.windowStart.Add(globalWindow).Sub(now), log: !l.windowLogged, global: true}
		l.windowLogged = true
		return r, false
	}
	if ok {
		if c != nil {
			l.order.Remove(l.clients[key])
			delete(l.clients, key)
		}
		return refusal{}, true
	}
	l.windowFails++
	if c == nil {
		if len(l.clients) >= maxClients {
			oldest := l.order.Front()
			l.order.Remove(oldest)
			delete(l.clients, oldest.Value.(*client).key)
		}
		c = &client{key: key}
		l.clients[key] = l.order.PushBack(c)
	} else {
		l.order.MoveToBack(l.clients[key])
	}
	c.fails++
	c.last = now
	if c.fails > freeFailures {
		d := maxDelay
		if n := c.fails - freeFailures - 1; n < 20 {
			d = min(firstDelay<<n, maxDelay)
		}
		c.until, c.logged = now.Add(d), false
	}
	return refusal{}, false
}

// forget drops the clients whose last failure is older than forgetAfter.
func (l *limiter) forget(now time.Time) {
	for e := l.order.Front(); e != nil; e = l.order.Front() {
		c := e.Value.(*client)
		if now.Sub(c.last) < forgetAfter {
			return
		}
		l.order.Remove(e)
		delete(l.clients, c.key)
	}
}

// retryAfter is wait in whole seconds, rounded up.
func retryAfter(wait time.Duration) int {
	return int((wait + time.Second - 1) / time.Second)
}
