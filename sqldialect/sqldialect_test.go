package sqldialect_test

import (
	"testing"

	"github.com/idemkit/idem/sqldialect"
)

func TestFamily(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f     sqldialect.Family
		name  string
		valid bool
	}{
		{sqldialect.PostgreSQL, "PostgreSQL", true},
		{sqldialect.MySQL, "MySQL", true},
		{sqldialect.SQLite, "SQLite", true},
		{0, "Family(0)", false},
		{9, "Family(9)", false},
	} {
		if got := tc.f.String(); got != tc.name {
			t.Errorf("String() = %q, want %q", got, tc.name)
		}
		if got := tc.f.Valid(); got != tc.valid {
			t.Errorf("%v.Valid() = %v", tc.f, got)
		}
		var d sqldialect.Dialect = tc.f
		if d.Family() != tc.f || sqldialect.Of(d) != tc.f {
			t.Errorf("%v is not its own Dialect", tc.f)
		}
	}
	if sqldialect.Of(nil) != 0 {
		t.Error("Of(nil) is not 0")
	}
}
