package natsjs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/internal/testenv"
)

// env is a test's stream on the NATS server: its own name and subjects,
// deleted at cleanup.
type env struct {
	js      jetstream.JetStream
	stream  string // e.g. T_1a2b3c
	subject string // the stream's subjects are subject + ".>"
}

func randName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := testenv.NATS.Need(t)
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		testenv.Unavailable(t, testenv.NATS.Name, testenv.NATS.Var, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// setup creates the test's stream. window is the stream's Duplicates
// window (0: the server's default, 2 min).
func setup(t testing.TB, window time.Duration) env {
	t.Helper()
	_, js := connect(t)
	name := randName()
	e := env{js: js, stream: "T_" + name, subject: "t" + name}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>"}, Duplicates: window, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), e.stream) })
	return e
}

// seqID is the inbox's ID of the message at seq in e's stream, which has
// no Nats-Msg-Id: "<stream>:<seq>:<the message's time in Unix ns>".
func seqID(t testing.TB, e env, seq uint64) string {
	t.Helper()
	s, err := e.js.Stream(context.Background(), e.stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d:%d", e.stream, seq, m.Time.UnixNano())
}
