package idemcli

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
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
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL, "-lease", "300ms")
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
	// Past several leases: the proxy must have kept the key alive (or
	// stored the answer) while the upstream still worked.
	time.Sleep(time.Second)
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
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL, "-lease", "300ms")
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
