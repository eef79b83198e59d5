package idemcli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
)

// retryUntilAnswered sends the same request until it is no longer
// answered 409 PROCESSING (or the deadline passes) and returns the answer.
func retryUntilAnswered(t *testing.T, url, key, body string) answer {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := send(t, http.MethodPost, url, key, body)
		if a.status != http.StatusConflict || a.code() != idemhttp.CodeProcessing {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 409 PROCESSING after 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client that goes away after the upstream got its request does not
// cut the upstream call: the upstream's answer is stored, and the retry
// replays it, with one upstream call, even after the lease.
func TestProxyClientGoneBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	got := make(chan struct{}, 1)
	answerNow := make(chan struct{})
	up.on("/pay", func(w http.ResponseWriter, r *http.Request, n int) {
		got <- struct{}{}
		<-answerNow
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "paid by call %d", n)
	})
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL, "-lease", "1500ms")
	key := newKey("gone")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/pay", strings.NewReader(`{"amount":5}`))
	req.Header.Set("Idempotency-Key", key)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		close(answerNow)
		t.Fatal("the upstream did not get the request")
	}
	cancel() // the client goes away while the upstream works
	<-done
	// Past two leases: the proxy must have kept the key alive (or stored
	// the answer) while the upstream still worked. The lease leaves each
	// renewal a second, so a loaded machine does not lose it.
	time.Sleep(4 * time.Second)
	close(answerNow)
	a := retryUntilAnswered(t, base+"/pay", key, `{"amount":5}`)
	if a.status != http.StatusCreated || a.body != "paid by call 1" || !a.replayed() {
		t.Fatalf("retry: %d %v %q; want the first call's 201 replayed", a.status, a.header, a.body)
	}
	up.wantCalls(t, "/pay", 1)
}

// A client that goes away in the middle of a streamed answer: the proxy
// reads the answer to its end and stores it, so the retry replays it in
// full and the upstream is called once.
func TestProxyClientGoneMidStream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	clientGone := make(chan struct{})
	up.on("/stream", func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: first of call %d\n\n", n)
		w.(http.Flusher).Flush()
		select {
		case <-clientGone:
		case <-time.After(20 * time.Second):
		}
		// Enough to fail a write to the gone client.
		for i := range 64 {
			fmt.Fprintf(w, "data: %d %s\n\n", i, strings.Repeat("x", 1024))
			w.(http.Flusher).Flush()
		}
	})
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL, "-lease", "1500ms")
	key := newKey("stream-gone")
	req, _ := http.NewRequest(http.MethodPost, base+"/stream", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: first of call 1\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	resp.Body.Close() // the client goes away mid-stream
	close(clientGone)
	a := retryUntilAnswered(t, base+"/stream", key, `{}`)
	if a.status != http.StatusOK || !a.replayed() || !strings.HasPrefix(a.body, "data: first of call 1\n\n") ||
		!strings.HasSuffix(a.body, "data: 63 "+strings.Repeat("x", 1024)+"\n\n") {
		t.Fatalf("retry: %d %v %d bytes, ending %q; want the whole first answer replayed", a.status, a.header, len(a.body), a.body[max(0, len(a.body)-60):])
	}
	up.wantCalls(t, "/stream", 1)
}

// An answer whose body breaks off (the upstream's connection closes
// before the Content-Length it announced): the upstream got the request
// and answered, so under -ambiguous keep the key stays in flight (409, no
// second call) and the log says so, not that a handler panicked and the
// key was released. Under -ambiguous release the retry reaches the
// upstream.
func TestProxyBodyBreaksOff(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{ambiguousKeep, ambiguousRelease} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			up.on("/pay", func(w http.ResponseWriter, r *http.Request, n int) {
				if n > 1 {
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, "paid by call %d", n)
					return
				}
				answerBreaksOff(t, w)
			})
			stderr := &obstest.LogBuffer{}
			base := startProxyLog(t, stderr, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL,
				"-lease", "1m", "-ambiguous", policy)
			key := newKey("breaks")
			req, _ := http.NewRequest(http.MethodPost, base+"/pay", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil {
					t.Fatalf("first: %d read in full; want an answer that breaks off", resp.StatusCode)
				}
			}
			up.wantCalls(t, "/pay", 1)
			retry := send(t, http.MethodPost, base+"/pay", key, `{}`)
			logs := stderr.String()
			if strings.Contains(logs, "handler panicked") {
				t.Errorf("log says a handler panicked:\n%s", logs)
			}
			switch policy {
			case ambiguousKeep:
				if retry.status != http.StatusConflict || retry.code() != idemhttp.CodeProcessing {
					t.Fatalf("retry: %d %s; want 409 PROCESSING", retry.status, retry.body)
				}
				up.wantCalls(t, "/pay", 1)
				if !strings.Contains(logs, "outcome unknown") {
					t.Errorf("log does not say the outcome is unknown:\n%s", logs)
				}
			case ambiguousRelease:
				if retry.status != http.StatusCreated || retry.body != "paid by call 2" {
					t.Fatalf("retry: %d %s; want the upstream's 201", retry.status, retry.body)
				}
				up.wantCalls(t, "/pay", 2)
			}
		})
	}
}

// answerBreaksOff answers 201 with a Content-Length of 1000 and closes
// the connection after a few bytes of the body.
func answerBreaksOff(t *testing.T, w http.ResponseWriter) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	fmt.Fprint(brw, "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\npaid, and then")
	brw.Flush()
}

// A streamed answer cut at -max-execution is an unknown outcome too: the
// upstream answered, so under -ambiguous keep the key stays in flight and
// the retry does not reach the upstream within the lease.
func TestProxyStreamPastMaxExecution(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	up.on("/stream", func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-stop:
				return
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL,
		"-upstream-timeout", "100ms", "-max-execution", "300ms", "-lease", "1m")
	key := newKey("endless")
	req, _ := http.NewRequest(http.MethodPost, base+"/stream", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("first: %d read in full; want a stream cut at -max-execution", resp.StatusCode)
		}
	}
	retry := send(t, http.MethodPost, base+"/stream", key, `{}`)
	if retry.status != http.StatusConflict || retry.code() != idemhttp.CodeProcessing {
		t.Fatalf("retry: %d %.100q; want 409 PROCESSING", retry.status, retry.body)
	}
	up.wantCalls(t, "/stream", 1)
}

// Two proxies on one store, 40 concurrent duplicates split between them,
// and an upstream that answers past several leases: one upstream call,
// every answer the first one (the lease is renewed while the upstream
// works, so no retry takes the key over).
func TestProxyTwoProxiesOneStore(t *testing.T) {
	t.Parallel()
	for _, b := range proxyBackends {
		if b.name != "PostgreSQL" && b.name != "Redis" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			up.on("/orders", func(w http.ResponseWriter, r *http.Request, n int) {
				time.Sleep(11 * time.Second) // the upstream's work, past 2 leases
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "order by call %d", n)
			})
			// A 5 s lease, renewed every 1.7 s: with 2 s, a CI machine at a
			// load of 16 once confirmed no renewal within the lease, the
			// proxy cut its call (as it must) and the other took over.
			flags := append(b.flags(t), "-upstream", up.URL, "-lease", "5s", "-wait", "40s")
			bases := []string{startProxy(t, flags...), startProxy(t, flags...)}
			key := newKey("two")
			// 100 duplicates once starved the renewal: their polls (every 5
			// to 250 ms each, -wait) held the proxy's 16 connections on a
			// machine at a load of 12, no renewal was confirmed within the
			// lease, the proxy cut its call and the other took over, and
			// the upstream saw two calls (the limit of an effect outside
			// the store, reliability.md). 40 keep the test about sharing
			// a key between two proxies.
			const n = 40
			answers := make([]answer, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { answers[i] = send(t, http.MethodPost, bases[i%2]+"/orders", key, `{"sku":"A-1"}`) })
			}
			wg.Wait()
			up.wantCalls(t, "/orders", 1)
			for i, a := range answers {
				if a.status != http.StatusCreated || a.body != "order by call 1" {
					t.Fatalf("answer %d: %d %s; want the first call's 201", i, a.status, a.body)
				}
			}
		})
	}
}
