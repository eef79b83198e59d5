package dsn

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/sqlstore"
)

func TestParseDB(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw     string
		dialect sqlstore.Dialect
		// dsn is the go-sql-driver DSN a MySQL value turns into.
		dsn string
	}{
		{"sqlite:shopdata/shop.db", sqlstore.SQLite, ""},
		{"sqlite:/var/lib/shop/shop.db", sqlstore.SQLite, ""},
		{"postgres://app:pw@db:5432/shop?sslmode=disable", sqlstore.PostgreSQL, ""},
		{"postgresql://app@db/shop", sqlstore.PostgreSQL, ""},
		{"postgres:///shop?host=/var/run/postgresql", sqlstore.PostgreSQL, ""},
		{"postgres://app@db?dbname=shop", sqlstore.PostgreSQL, ""},
		{"mysql://app:pw@db:3307/shop", sqlstore.MySQL, "app:pw@tcp(db:3307)/shop"},
		{"mysql://app@db/shop", sqlstore.MySQL, "app@tcp(db:3306)/shop"},
		{"mysql://app:p%40ss@db/shop?tls=skip-verify&timeout=5s", sqlstore.MySQL, "app:p@ss@tcp(db:3306)/shop?timeout=5s&tls=skip-verify"},
		{"mysql://app@[::1]:3306/shop", sqlstore.MySQL, "app@tcp([::1]:3306)/shop"},
		{"mysql:app:pw@tcp(db:3306)/shop", sqlstore.MySQL, "app:pw@tcp(db:3306)/shop"},
		{"mysql:app@unix(/run/mysqld/mysqld.sock)/shop", sqlstore.MySQL, "app@unix(/run/mysqld/mysqld.sock)/shop"},
	} {
		got, err := ParseDB(c.raw)
		if err != nil {
			t.Errorf("%s: %v", c.raw, err)
			continue
		}
		if got.Dialect != c.dialect {
			t.Errorf("%s: dialect %v, want %v", c.raw, got.Dialect, c.dialect)
		}
		if c.dsn != "" {
			if dsn := got.MySQL.FormatDSN(); dsn != c.dsn {
				t.Errorf("%s: DSN %q, want %q", c.raw, dsn, c.dsn)
			}
		}
		if strings.Contains(got.Display, "pw") {
			t.Errorf("%s: display %q shows the password", c.raw, got.Display)
		}
	}
}

func TestParseDBRejects(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"",
		"shop.db",
		"sqlite:",
		"sqlite://x/shop.db",
		"sqlite::memory:",
		"sqlite:file:x.db",
		"sqlite:x.db?mode=ro",
		"postgres://app:secretpw@db:notaport/shop",
		"postgres://app:secretpw@db/shop?sslmode=bogus",
		"mysql://app:secretpw@db:3306/",
		"mysql://app:secretpw@/shop",
		"mysql://app:secretpw@db/a/b",
		"mysql://app:secretpw@db/shop?tls=bogus",
		"mysql:app:secretpw@tcp(db:3306)",
		"mysqlx://app:secretpw@db/shop",
		// Without a host or a database, pgx and go-sql-driver fall back to
		// defaults (a local server, a database named after the OS user) and
		// a program would migrate whatever database that is: an unset variable
		// in -db "postgres://$HOST/shop" must not land there.
		"postgres://",
		"postgres:///shop",
		"postgresql://app:secretpw@/shop",
		"postgres://app:secretpw@db:5432",
		"postgres://app:secretpw@db/",
		"postgres://app:secretpw@db/shop?dbname=",
		"mysql:",
		"mysql:/",
		"mysql:app:secretpw@tcp(db:3306)/",
		"redis://app:secretpw@db/0",
	} {
		_, err := ParseDB(raw)
		if err == nil {
			t.Errorf("%q: accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "secretpw") {
			t.Errorf("%q: the error shows the password: %v", raw, err)
		}
	}
}

func TestParseRedis(t *testing.T) {
	t.Parallel()
	opts, display, err := ParseRedis("redis://u:secretpw@cache:6380/2")
	if err != nil || opts.Addr != "cache:6380" || opts.DB != 2 || opts.Password != "secretpw" || !opts.ContextTimeoutEnabled {
		t.Fatalf("%+v, %v", opts, err)
	}
	if strings.Contains(display, "secretpw") {
		t.Errorf("display %q shows the password", display)
	}
	if opts, _, err := ParseRedis("unix:///run/redis/redis.sock?db=1"); err != nil || opts.Network != "unix" {
		t.Errorf("a unix socket: %+v, %v", opts, err)
	}
	for _, raw := range []string{"cache:6379", "http://cache:6379/0", "redis://u:secretpw@cache:6379/x", "redis://cache:6379/0?dial_timeout=soon",
		// No host: go-redis would use localhost:6379, a Redis nobody named
		// (an unset variable in -redis "redis://$HOST:6379/0").
		"redis://", "redis://:6379/0", "rediss://u:secretpw@:6379/0", "redis:///0"} {
		_, _, err := ParseRedis(raw)
		if err == nil {
			t.Errorf("%q: accepted", raw)
		} else if strings.Contains(err.Error(), "secretpw") {
			t.Errorf("%q: the error shows the password: %v", raw, err)
		}
	}
}

func FuzzParseDB(f *testing.F) {
	for _, s := range []string{"sqlite:x.db", "postgres://a@b/c", "mysql://a:b@c/d?tls=true", "mysql:a@tcp(b)/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseDB(raw)
		if err == nil && got.Dialect == nil {
			t.Fatalf("%q: no error and no dialect", raw)
		}
	})
}

// A password can sit elsewhere than in the URL's user info: pgx reads
// ?password= and ?sslpassword= from the query, and a libpq keyword/value
// string (host=… password=…), which is not a value these programs take,
// lands in the error that says so. None of them may show it.
func TestPasswordOutsideTheUserInfo(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"postgres://db/shop?password=secretpw",
		"postgres://app@db/shop?sslmode=disable&password=secretpw",
		"postgres://app@db/shop?sslpassword=secretpw&sslmode=disable",
		"postgres://app@db/shop?PASSWORD=secretpw",
		"postgres://app@db/shop?password=secret%20pw%zz",
	} {
		got, err := ParseDB(raw)
		if err == nil && strings.Contains(got.Display, "secret") {
			t.Errorf("%q: display %q shows the password", raw, got.Display)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", raw, err)
		}
		if r := Redact(raw); strings.Contains(r, "secret") {
			t.Errorf("Redact(%q) = %q", raw, r)
		}
	}
	for _, raw := range []string{
		"host=db password=secretpw dbname=shop",
		"host=db password='secret pw' dbname=shop",
		"host=db password = secretpw",
		"postgres://app@db:bad/shop?password=secretpw",
	} {
		_, err := ParseDB(raw)
		if err == nil {
			t.Errorf("%q: accepted", raw)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", raw, err)
		}
	}
}

// FuzzNoPasswordShown builds database and Redis values around a password
// (in the user info of each URL form, in a raw MySQL DSN, or as a
// password= parameter) with any text around it (the password holding no
// character that would end it there): neither the Display of
// what is accepted nor the error of what is refused shows the password,
// as written or escaped.
func FuzzNoPasswordShown(f *testing.F) {
	for i := range 8 {
		f.Add(uint8(i), "user", "s3cretpw", "db.example:5432/app?sslmode=disable")
	}
	f.Add(uint8(4), "u", "s3cretpw", "h:6379/x")
	f.Add(uint8(6), "u", "s3cretpw", "tcp(h:3306)/d?x=%zz")
	f.Add(uint8(7), "u", "s3cretpw", "h/d")
	f.Fuzz(func(t *testing.T, form uint8, user, pass, rest string) {
		// A '/', '?' or '#' ends the user info (or a MySQL DSN's password;
		// a user name with a delimiter is no user name),
		// and '&', ';', '@' or a space ends a parameter: what follows is no
		// longer the password.
		if len(pass) < 6 || strings.Contains(user+rest, pass) || strings.ContainsAny(pass, "/?#") || strings.ContainsAny(user, "/?#@:") ||
			form%8 >= 6 && strings.ContainsAny(pass, "@&; \t\n\f\r") {
			return
		}
		raw := strings.NewReplacer("USER", user, "PASS", pass, "REST", rest).Replace([]string{
			"postgres://USER:PASS@REST", "postgresql://USER:PASS@REST", "mysql://USER:PASS@REST",
			"redis://USER:PASS@REST", "rediss://USER:PASS@REST", "mysql:USER:PASS@REST",
			"postgres://USER@REST&password=PASS", "postgres://USER@REST?sslpassword=PASS",
		}[form%8])
		var shown string
		if IsRedis(raw) {
			_, display, err := ParseRedis(raw)
			shown = display
			if err != nil {
				shown = err.Error()
			}
		} else {
			db, err := ParseDB(raw)
			shown = db.Display
			if err != nil {
				shown = err.Error()
			}
		}
		forms := []string{pass, strings.Trim(strconv.Quote(pass), `"`)}
		if dec, err := url.PathUnescape(pass); err == nil {
			forms = append(forms, dec)
		}
		for _, p := range forms {
			if len(p) >= 6 && strings.Contains(shown, p) && !strings.Contains(user+rest, p) &&
				!strings.Contains(strconv.Quote(user)+strconv.Quote(rest), p) {
				t.Fatalf("%q shows the password %q: %s", raw, p, shown)
			}
		}
	})
}
