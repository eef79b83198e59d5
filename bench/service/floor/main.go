// Command floor is the floor of bench/service/run on MySQL/MariaDB and
// SQLite: the statements one shopd order sends, read from a script
// (floor_mysql.sql, floor_sqlite.sql), run straight against the database
// by -c clients for -d, each on its own connection with every statement
// prepared once, as pgbench -M prepared does on PostgreSQL. It talks to
// the driver (github.com/go-sql-driver/mysql, modernc.org/sqlite)
// directly, without database/sql, and prints one line,
//
//	FLOOR tx=N seconds=S tps=R failed=F
//
// which the runner parses: tx transactions committed in S seconds (from
// the start of the first transaction, after connecting and preparing),
// failed the transactions that hit an error (each is rolled back, and
// the first error goes to stderr).
//
// A script is a list of statements, each introduced by "-- name: NAME"
// and followed by comment lines that say how to run it:
//
//	-- params: a b c    the parameters bound to its placeholders, in order
//	                    (several lines add up); names of the values below
//	-- send: text       sent as is (START TRANSACTION, COMMIT), not prepared
//	-- rows: N          a query: it must return N rows, which are read
//	-- affected: N      it must change N rows
//	-- shopd: prepare each time
//	                    shopd has it prepared, executed and closed for every
//	                    order; with -reprepare the floor does so too
//
// Each transaction draws a user (1-1000) and a product (SKU-100 …
// SKU-199), and binds a key and an order number no other transaction
// uses (-run, the client and a counter make them unique across rounds
// and runs). The other values are constants of the size and type shopd
// binds.
package main

import (
	"bufio"
	"context"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type statement struct {
	name     string
	text     string
	params   []string
	plain    bool // send as text, not prepared
	each     bool // shopd prepares it each time
	rows     int  // -1: not a query
	affected int  // -1: not checked
}

func main() {
	db := flag.String("db", "", "mysql:DSN (a go-sql-driver DSN) or sqlite:PATH")
	script := flag.String("f", "", "script of the statements of one transaction")
	clients := flag.Int("c", 16, "concurrent clients, one connection each")
	dur := flag.Duration("d", 6*time.Second, "how long to run")
	run := flag.String("run", "run", "word that makes keys and order numbers unique to this run")
	reprepare := flag.Bool("reprepare", false, "prepare, execute and close the statements shopd prepares each time, as it does")
	flag.Parse()
	if err := floor(*db, *script, *clients, *dur, *run, *reprepare, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func floor(db, script string, clients int, dur time.Duration, run string, reprepare bool, out io.Writer) error {
	connector, err := open(db)
	if err != nil {
		return err
	}
	f, err := os.Open(script)
	if err != nil {
		return err
	}
	stmts, err := parse(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", script, err)
	}
	ctx := context.Background()
	workers := make([]*worker, clients)
	for i := range workers {
		w, err := newWorker(ctx, connector, stmts, i+1, run)
		if err != nil {
			return fmt.Errorf("client %d: %w", i+1, err)
		}
		w.reprepare = reprepare
		defer w.close()
		workers[i] = w
	}
	var done, failed atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for _, w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := w.tx(ctx); err != nil {
					failed.Add(1)
					firstErr.Do(func() { fmt.Fprintf(os.Stderr, "floor: client %d: %v\n", w.client, err) })
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	_, err = fmt.Fprintf(out, "FLOOR tx=%d seconds=%.3f tps=%.1f failed=%d\n", done.Load(), secs, float64(done.Load())/secs, failed.Load())
	return err
}

// parse reads a script (see the package doc).
func parse(r io.Reader) ([]statement, error) {
	var stmts []statement
	var cur *statement
	var text strings.Builder
	flush := func() {
		if cur != nil {
			cur.text = strings.TrimSuffix(strings.TrimSpace(text.String()), ";")
			stmts = append(stmts, *cur)
		}
		text.Reset()
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			cur = &statement{name: strings.TrimSpace(name), rows: -1, affected: -1}
			continue
		}
		if cur == nil || strings.TrimSpace(line) == "" {
			continue
		}
		if c, ok := strings.CutPrefix(line, "--"); ok {
			c = strings.TrimSpace(c)
			var err error
			switch {
			case strings.HasPrefix(c, "params:"):
				cur.params = append(cur.params, strings.Fields(strings.TrimPrefix(c, "params:"))...)
			case c == "send: text":
				cur.plain = true
			case c == "shopd: prepare each time":
				cur.each = true
			case strings.HasPrefix(c, "rows:"):
				cur.rows, err = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(c, "rows:")))
			case strings.HasPrefix(c, "affected:"):
				cur.affected, err = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(c, "affected:")))
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", cur.name, line, err)
			}
			continue
		}
		text.WriteString(line)
		text.WriteByte('\n')
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(stmts) == 0 {
		return nil, errors.New("no statement")
	}
	for _, s := range stmts {
		if s.text == "" {
			return nil, fmt.Errorf("%s: no text", s.name)
		}
		if s.plain && len(s.params) > 0 {
			return nil, fmt.Errorf("%s: a statement sent as text binds no parameter", s.name)
		}
		for _, p := range s.params {
			if _, ok := valueIndex[p]; !ok {
				return nil, fmt.Errorf("%s: unknown parameter %q", s.name, p)
			}
		}
	}
	return stmts, nil
}

// Values a transaction binds, by name. Constants have the size and type
// of shopd's: a fingerprint "v1:" and 64 hex digits, an owner of 32 hex
// digits, the stored 201 answer's header (a string) and ~180-byte body
// (bytes).
var valueIndex = map[string]int{}

var valueNames = []string{
	"scope", "key", "fingerprint", "owner", "lease_ms", "retention_ms", "fence",
	"quantity", "sku", "order_no", "user_id", "amount_cents", "coupon_id",
	"reserved_qty", "status", "created_at",
	"response_status", "response_header", "response_body", "body_omitted",
}

func init() {
	for i, n := range valueNames {
		valueIndex[n] = i
	}
}

type worker struct {
	client    int
	reprepare bool
	run       string
	n         int
	conn      driver.Conn
	stmts     []statement
	prep      []driver.Stmt
	vals      []driver.Value
	rng       *rand.Rand
	row       []driver.Value
}

func newWorker(ctx context.Context, c driver.Connector, stmts []statement, client int, run string) (*worker, error) {
	conn, err := c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	w := &worker{client: client, run: run, conn: conn, stmts: stmts, prep: make([]driver.Stmt, len(stmts)),
		vals: make([]driver.Value, len(valueNames)), rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(client)))}
	for i, s := range stmts {
		if s.plain {
			continue
		}
		st, err := conn.(driver.ConnPrepareContext).PrepareContext(ctx, s.text)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("prepare %s: %w", s.name, err)
		}
		if st.NumInput() >= 0 && st.NumInput() != len(s.params) {
			w.close()
			return nil, fmt.Errorf("%s: %d placeholders, %d params", s.name, st.NumInput(), len(s.params))
		}
		w.prep[i] = st
	}
	w.vals[valueIndex["fingerprint"]] = "v1:433b9e89ff43c7b2c73d2eecd6e94fed9bee838c406be8442d7e143a98cee55c"
	w.vals[valueIndex["owner"]] = "89c2407a9b639cb4b75de411c82ec945"
	w.vals[valueIndex["lease_ms"]] = int64(30000)
	w.vals[valueIndex["retention_ms"]] = int64(86400000)
	w.vals[valueIndex["fence"]] = int64(1)
	w.vals[valueIndex["quantity"]] = int64(1)
	w.vals[valueIndex["coupon_id"]] = nil
	w.vals[valueIndex["reserved_qty"]] = int64(1)
	w.vals[valueIndex["status"]] = "WAIT_PAY"
	w.vals[valueIndex["created_at"]] = "2026-12-02T17:44:25.72359659Z"
	w.vals[valueIndex["response_status"]] = int64(201)
	w.vals[valueIndex["response_header"]] = `{"Content-Type":["application/json"],"Location":["/orders/ord_80717a8769fb24dc17b6ca4f"]}`
	w.vals[valueIndex["response_body"]] = []byte(`{"order_no":"ord_80717a8769fb24dc17b6ca4f","user_id":1,"sku":"SKU-007","quantity":1,"amount_cents":107,"status":"WAIT_PAY","version":1,"created_at":"2026-12-02T17:44:25.72359659Z"}`)
	w.vals[valueIndex["body_omitted"]] = false
	return w, nil
}

func (w *worker) close() {
	for _, st := range w.prep {
		if st != nil {
			st.Close()
		}
	}
	w.conn.Close()
}

// tx runs one transaction: the script's statements in order. On an
// error it sends ROLLBACK (harmless outside a transaction).
func (w *worker) tx(ctx context.Context) error {
	w.n++
	uid := 1 + w.rng.IntN(1000)
	sku := 100 + w.rng.IntN(100)
	w.vals[valueIndex["scope"]] = "user:" + strconv.Itoa(uid)
	w.vals[valueIndex["key"]] = fmt.Sprintf("floor-%s-%d-%d", w.run, w.client, w.n)
	w.vals[valueIndex["sku"]] = "SKU-" + strconv.Itoa(sku)
	w.vals[valueIndex["order_no"]] = fmt.Sprintf("ord_%s_%d_%d", w.run, w.client, w.n)
	w.vals[valueIndex["user_id"]] = int64(uid)
	w.vals[valueIndex["amount_cents"]] = int64(100 + sku)
	for i := range w.stmts {
		if err := w.exec(ctx, i); err != nil {
			if _, rerr := w.conn.(driver.ExecerContext).ExecContext(ctx, "ROLLBACK", nil); rerr != nil {
				return fmt.Errorf("%w (and ROLLBACK: %v)", err, rerr)
			}
			return err
		}
	}
	return nil
}

func (w *worker) exec(ctx context.Context, i int) error {
	s := &w.stmts[i]
	if s.plain {
		_, err := w.conn.(driver.ExecerContext).ExecContext(ctx, s.text, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		return nil
	}
	st := w.prep[i]
	if s.each && w.reprepare {
		var err error
		if st, err = w.conn.(driver.ConnPrepareContext).PrepareContext(ctx, s.text); err != nil {
			return fmt.Errorf("prepare %s: %w", s.name, err)
		}
		defer st.Close()
	}
	args := make([]driver.NamedValue, len(s.params))
	for j, p := range s.params {
		args[j] = driver.NamedValue{Ordinal: j + 1, Value: w.vals[valueIndex[p]]}
	}
	if s.rows >= 0 {
		rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, args)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if cap(w.row) < len(rows.Columns()) {
			w.row = make([]driver.Value, len(rows.Columns()))
		}
		row := w.row[:len(rows.Columns())]
		n := 0
		for {
			if err = rows.Next(row); err != nil {
				break
			}
			n++
		}
		cerr := rows.Close()
		if err != io.EOF {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if cerr != nil {
			return fmt.Errorf("%s: %w", s.name, cerr)
		}
		if n != s.rows {
			return fmt.Errorf("%s: %d rows, want %d", s.name, n, s.rows)
		}
		return nil
	}
	res, err := st.(driver.StmtExecContext).ExecContext(ctx, args)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if s.affected >= 0 {
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if n != int64(s.affected) {
			return fmt.Errorf("%s: %d rows changed, want %d", s.name, n, s.affected)
		}
	}
	return nil
}
