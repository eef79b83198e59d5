package main

import (
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// open returns the driver's connector for db: mysql:DSN, a go-sql-driver
// DSN, with the driver's defaults, as shopd's -db mysql:DSN opens it.
func open(db string) (driver.Connector, error) {
	if dsn, ok := strings.CutPrefix(db, "mysql:"); ok {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("-db: %w", err)
		}
		return mysql.NewConnector(cfg)
	}
	return nil, fmt.Errorf("-db %q: want mysql:DSN", db)
}
