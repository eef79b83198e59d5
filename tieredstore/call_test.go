package tieredstore

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// honoursDeadlines reads ContextTimeoutEnabled from the clients whose
// options it knows, and says no for any other client.
func TestHonoursDeadlines(t *testing.T) {
	for _, c := range []struct {
		name   string
		client Client
		want   bool
	}{
		{"client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), false},
		{"client with deadlines", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), true},
		{"cluster with deadlines", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), true},
		{"ring with deadlines", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true}), true},
		{"universal, single", redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), true},
		{"another client", struct{ Client }{}, false},
	} {
		if got := honoursDeadlines(c.client); got != c.want {
			t.Errorf("%s: honoursDeadlines = %v, want %v", c.name, got, c.want)
		}
		if closer, ok := c.client.(interface{ Close() error }); ok {
			_ = closer.Close()
		}
	}
}
