// Package netfault is a TCP proxy for tests that need a server to fail on
// cue: refuse connections, drop the open ones, stall them, or lose a
// response the server has sent. Tests put it between a client and a real
// server on loopback.
package netfault

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its own loopback address to a
// target, until told to fail.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	refuse  bool
	stalled bool
	resume  chan struct{} // closed when a stall ends
	dropIf  func(request []byte) bool
	latency time.Duration
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// New starts a proxy on 127.0.0.1 (a free port) to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Refuse makes the proxy close every new connection at once (as a server
// that is down would) while refuse is true.
func (p *Proxy) Refuse(refuse bool) {
	p.mu.Lock()
	p.refuse = refuse
	p.mu.Unlock()
}

// Drop closes every open connection, both sides.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Reset closes every open connection with a TCP reset (SO_LINGER 0) on
// both sides, as a server that crashed or a middlebox that forgot the
// connection would: the peers see "connection reset by peer" rather than
// an orderly close.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}

// SetLatency delays every chunk of bytes, in both directions, by d (0:
// none) before forwarding it, on open and new connections: a slow or
// distant server.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// maxRequest bounds the bytes of a request kept for DropResponsesIf's
// function: its start, where the request line and headers are.
const maxRequest = 64 << 10

// DropResponsesIf makes the proxy lose responses: when the server starts
// to answer on a connection, f gets what the client sent on it since the
// server last answered (the request, or its first 64 KiB), and if it
// reports true the answer is not forwarded and the connection is closed,
// both sides. The server has received the whole request and acted on it
// (it answers after reading it); the client sees its connection closed
// with no response, or a part of one if an earlier chunk got through (f
// is asked at the first chunk of each answer only). f is called from the
// proxy's goroutines, concurrently for different connections. A nil f
// forwards every response again.
func (p *Proxy) DropResponsesIf(f func(request []byte) bool) {
	p.mu.Lock()
	p.dropIf = f
	p.mu.Unlock()
}

// Stall stops forwarding bytes on every connection, open or new, until
// Resume: the peers see a server that hangs.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.resume = make(chan struct{})
	}
}

// Resume ends a stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Resume()
	p.Drop()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		if p.closed {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, true) || !p.track(server, true) {
		client.Close()
		server.Close()
		return
	}
	defer p.track(client, false)
	defer p.track(server, false)
	l := &link{client: client, server: server}
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, server, client, true); done <- struct{}{} }()
	go func() { p.pipe(l, client, server, false); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
}

// link is one proxied connection: the client's side, the server's, and
// what the client sent since the server last answered.
type link struct {
	client, server net.Conn

	mu      sync.Mutex
	request []byte
}

// pipe copies src to dst, holding every chunk while the proxy is stalled.
// toServer: src is the client; its bytes are kept for DropResponsesIf
// before they are forwarded, so the server cannot answer a request before
// it is kept.
func (p *Proxy) pipe(l *link, dst, src net.Conn, toServer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			resume, dropIf, latency := p.resume, p.dropIf, p.latency
			p.mu.Unlock()
			<-resume
			if latency > 0 {
				time.Sleep(latency)
			}
			if toServer {
				l.mu.Lock()
				if room := maxRequest - len(l.request); room > 0 {
					l.request = append(l.request, buf[:min(n, room)]...)
				}
				l.mu.Unlock()
			} else {
				l.mu.Lock()
				request := l.request
				l.request = nil
				l.mu.Unlock()
				if request != nil && dropIf != nil && dropIf(request) {
					l.client.Close()
					l.server.Close()
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a closed connection
			return
		}
	}
}
