package testdb

import "testing"

func TestWithDatabase(t *testing.T) {
	for dsn, want := range map[string]string{
		"root@tcp(127.0.0.1:3306)/test?parseTime=false": "root@tcp(127.0.0.1:3306)/x?parseTime=false",
		"root@tcp(127.0.0.1:3306)/test":                 "root@tcp(127.0.0.1:3306)/x",
		"u:p/w@unix(/run/mysqld/mysqld.sock)/":          "u:p/w@unix(/run/mysqld/mysqld.sock)/x",
		"/test?a=b/c":                                   "/x?a=b/c",
		"root@tcp(h:1)":                                 "root@tcp(h:1)/x",
	} {
		if got := WithDatabase(dsn, "x"); got != want {
			t.Errorf("WithDatabase(%q) = %q, want %q", dsn, got, want)
		}
	}
}
