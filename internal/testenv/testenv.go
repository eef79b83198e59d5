// Package testenv finds the external services that tests use: each
// service's address comes from an environment variable with a loopback
// default. A test that cannot reach its service skips with a message that
// names the variable — or fails, when IDEM_REQUIRE_SERVICES=1 (as CI sets
// it), so that a missing service is never mistaken for a passing test.
package testenv

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// RequireVar is the environment variable that turns a missing service
// into a test failure.
const RequireVar = "IDEM_REQUIRE_SERVICES"

// A Service is an external server the tests may use.
type Service struct {
	Name    string // e.g. "PostgreSQL"
	Var     string // the environment variable holding its address
	Default string // the address when Var is unset
}

// The services of the development and CI machines.
var (
	Postgres = Service{"PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"}
	MySQL    = Service{"MySQL/MariaDB", "IDEM_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=false"}
	Redis    = Service{"Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379"}
	RabbitMQ = Service{"RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"}
	NATS     = Service{"NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222"}
)

// Addr returns the service's address: Var's value, or Default.
func (s Service) Addr() string {
	if v := os.Getenv(s.Var); v != "" {
		return v
	}
	return s.Default
}

// Need returns the service's address after checking that its TCP port
// answers; otherwise it skips t (or fails it under IDEM_REQUIRE_SERVICES=1)
// with a message naming the variable.
func (s Service) Need(t testing.TB) string {
	t.Helper()
	addr := s.Addr()
	hostport := hostPort(addr)
	conn, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err == nil {
		conn.Close()
		return addr
	}
	Unavailable(t, s.Name, s.Var, err)
	return ""
}

// Unavailable skips t because a service cannot be reached, or fails it
// when IDEM_REQUIRE_SERVICES=1. Use it when reaching the service needs more
// than a TCP connection (a server the test starts itself, say).
func Unavailable(t testing.TB, name, envVar string, err error) {
	t.Helper()
	if os.Getenv(RequireVar) == "1" {
		t.Fatalf("%s unreachable (set %s to its address): %v; %s=1 makes this a failure", name, envVar, err, RequireVar)
	}
	t.Skipf("%s unreachable (set %s to its address): %v", name, envVar, err)
}

// hostPort extracts host:port from a URL, a go-sql-driver DSN
// ("user@tcp(host:port)/db") or a bare host:port.
func hostPort(addr string) string {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		return u.Host
	}
	if i := strings.Index(addr, "tcp("); i >= 0 {
		rest := addr[i+4:]
		if j := strings.IndexByte(rest, ')'); j >= 0 {
			return rest[:j]
		}
	}
	return addr
}
