package shop

import (
	"errors"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
)

// isDuplicate reports whether err is a unique violation.
func isDuplicate(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "23505"
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1062
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return lite.Code() == 2067 || lite.Code() == 1555
	}
	return false
}
