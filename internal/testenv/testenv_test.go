package testenv

import "testing"

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable": "127.0.0.1:5432",
		"root@tcp(127.0.0.1:3306)/test":                           "127.0.0.1:3306",
		"127.0.0.1:6379":                                          "127.0.0.1:6379",
		"nats://127.0.0.1:4222":                                   "127.0.0.1:4222",
		"amqp://guest:guest@127.0.0.1:5672/":                      "127.0.0.1:5672",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}
