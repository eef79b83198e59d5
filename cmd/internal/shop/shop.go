package shop

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/token"
)

// Config configures a Shop.
type Config struct {
	// DB holds the shop's rows; it must be migrated with Migrate.
	DB *sql.DB
	// Dialect is DB's SQL dialect: sqlstore.SQLite (the default, when
	// nil), sqlstore.PostgreSQL or sqlstore.MySQL.
	Dialect sqlstore.Dialect
	// Store keeps the idempotency records. To keep orders and their stored
	// responses in one transaction it must complete in DB's transactions
	// (idem.TxCompleter on the same database).
	Store idem.Store
	// Lease is how long an execution holds its idempotency key before
	// another may take it over (renewed while it runs): the lease of the
	// middleware's records and of the refund runner's. Zero means
	// idem.DefaultLease (30 s). A request whose shopd died is resumed by
	// a retry after it ends.
	Lease time.Duration
	// Wait, when positive, makes a retry that arrives while the first
	// request is running wait up to this long and replay its answer instead
	// of getting 409 PROCESSING.
	Wait time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// PaySecret is the secret that signs payment callbacks (the
	// Pay-Signature header's HMAC-SHA256 key), shared with the payment
	// provider. Empty means DevPaySecret, which anyone can read: set it in
	// production.
	PaySecret string
	// EventIDPrefix starts the ID of every order event the shop writes
	// to its outbox (sqlstore.OutboxConfig.IDPrefix), a readable part
	// before the 26 characters that make the ID unique: two shops (two
	// databases, or one re-created or restored from a backup) whose
	// events meet in one stream or one consumer never share an ID,
	// whatever their prefixes. An event keeps the ID it was written
	// with, so a change of the prefix applies to new events only.
	// Default DefaultEventIDPrefix ("shop-").
	EventIDPrefix string
	// Observer receives the idempotency middleware's events (request
	// outcomes by route, store calls, leases) and the close job's sweeps
	// (idem.KindSweep: sent events, finished consume records, expired
	// submit tokens, with the dialect's name as Store); nil reports
	// nothing.
	Observer idem.Observer
	// StoreName names Store in Observer's events; empty means the
	// dialect's name ("sqlite", "postgres", "mysql").
	StoreName string
	// Provider refunds payments, charges cards and books shipments
	// (required): refunds and card checkouts go through it as operations
	// of steps (refund.go, cardcheckout.go); shopd's is a
	// *payprov.Client.
	Provider Provider
	// Steps configures the runner of the refund operations (nil:
	// steps' defaults; its Logger defaults to Logger): shopd's
	// -complete-interval is its Interval. Start its completer with
	// Shop.Runner().Start.
	Steps *steps.Config
	// AfterStep, when set, is called after each step of a refund or a
	// card checkout ends (with the step's name: StepRefunding,
	// StepProvider, StepRefunded, StepRefused; StepCharging, StepCharge,
	// StepDeclined, StepPaid, StepShip, StepShipped; also when a resumed
	// run found the step checkpointed) and after the provider's answer
	// arrived, before its checkpoint (StepProviderCall, StepChargeCall,
	// StepShipCall). It is for fault injection in tests (shopd's
	// SHOPD_CRASH_AFTER_STEP kills the process there).
	AfterStep func(step string)
	// Metrics, when set, serves GET /metrics (shopd: the Prometheus
	// handler of its registry), to any caller: no token, no user. Nil
	// leaves /metrics unrouted.
	Metrics http.Handler
}

// Shop serves the shop's HTTP API.
type Shop struct {
	db      *sql.DB
	dialect sqlstore.Dialect
	orders  *fsm.Table // shop_orders on orderMachine (orderfsm.go)
	q       queries
	log     *slog.Logger
	handler http.Handler
	// tokens are the submit tokens of POST /tokens and the checkout page,
	// kept in the shop's database (tokenStore, the table idem_tokens) so
	// that an order spends its token in the order's transaction.
	tokens     *token.Tokens
	tokenStore *sqlstore.TokenStore
	web        webQueries
	// pq and paySecret serve payment callbacks (payments.go).
	pq        payQueries
	paySecret string
	// events is the outbox the order's events are written to (events.go).
	events *sqlstore.OutboxStore
	// points reads the loyalty ledger (loyalty.go).
	points pointsQueries
	// eventPrefix is Config.EventIDPrefix (admin.go's retries).
	eventPrefix string
	// observer is Config.Observer: the close job reports its sweeps to
	// it (closer.go).
	observer idem.Observer
	// Refunds (refund.go): the provider, the journal and runner of the
	// operations of steps, the refund operation, and Config.AfterStep.
	provider Provider
	journal  *sqlstore.StepJournal
	runner   *steps.Runner
	refund   *steps.Op[refundInput, refundAnswer]
	cardOp   *steps.Op[checkoutInput, CardCheckout]
	stepHook func(step string)
}

// queries are the shop's statements in its database's placeholder style.
type queries struct {
	insertOrder, getOrder, listOrders                       string
	reserveStock, productPrice, productExists, listProducts string
	useClaim, couponDiscount                                string
}

// orderColumns are the columns scanOrder reads, in its order.
const orderColumns = `order_no, user_id, sku, quantity, amount_cents, coupon_id, status, version, created_at`

func newQueries(d sqlstore.Dialect) queries {
	return queries{
		// created_ms is the database's clock, which the close job's
		// cutoff is counted on too (closer.go): shopd processes' clocks
		// may disagree.
		insertOrder: rebind(d, `INSERT INTO shop_orders (order_no, user_id, sku, quantity, amount_cents, coupon_id, reserved_qty, status, version, created_at, created_ms, updated_ms)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, `+dbNowMS(d)+`, `+dbNowMS(d)+`)`),
		getOrder:   rebind(d, `SELECT `+orderColumns+` FROM shop_orders WHERE order_no = ? AND user_id = ?`),
		listOrders: rebind(d, `SELECT `+orderColumns+` FROM shop_orders WHERE user_id = ? ORDER BY id DESC LIMIT ?`),
		// One conditional update reserves the stock: it never goes below 0
		// however many orders race for the last items.
		reserveStock:  rebind(d, `UPDATE shop_products SET stock = stock - ? WHERE sku = ? AND stock >= ?`),
		productPrice:  rebind(d, `SELECT price_cents FROM shop_products WHERE sku = ?`),
		productExists: rebind(d, `SELECT 1 FROM shop_products WHERE sku = ?`),
		listProducts:  `SELECT sku, name, price_cents, stock FROM shop_products ORDER BY sku`,
		// A claim is used once: UNUSED → USED in one conditional update,
		// inside the order's transaction.
		useClaim: rebind(d, `UPDATE shop_coupon_claims SET status = 'USED', order_no = ?, version = version + 1
			WHERE user_id = ? AND coupon_id = ? AND status = 'UNUSED'`),
		couponDiscount: rebind(d, `SELECT discount_cents FROM shop_coupons WHERE id = ?`),
	}
}

// New returns a Shop over cfg.
func New(cfg Config) (*Shop, error) {
	if cfg.DB == nil || cfg.Store == nil {
		return nil, errors.New("shop: New needs a DB and a Store")
	}
	if cfg.Provider == nil {
		return nil, errors.New("shop: New needs a Provider (the payment provider that refunds)")
	}
	if _, ok := cfg.Store.(idem.TxCompleter); !ok {
		return nil, errors.New("shop: the store must complete inside the shop's transactions (idem.TxCompleter)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.Dialect {
	case nil:
		cfg.Dialect = sqlstore.SQLite
	case sqlstore.SQLite, sqlstore.PostgreSQL, sqlstore.MySQL:
	default:
		return nil, fmt.Errorf("shop: unknown dialect %v", cfg.Dialect)
	}
	if cfg.PaySecret == "" {
		cfg.PaySecret = DevPaySecret
	}
	var err error
	s := &Shop{db: cfg.DB, dialect: cfg.Dialect, q: newQueries(cfg.Dialect), log: cfg.Logger, web: newWebQueries(cfg.Dialect),
		pq: newPayQueries(cfg.Dialect), paySecret: cfg.PaySecret, points: newPointsQueries(cfg.Dialect),
		provider: cfg.Provider, stepHook: cfg.AfterStep}
	if cfg.EventIDPrefix == "" {
		cfg.EventIDPrefix = DefaultEventIDPrefix
	}
	s.eventPrefix = cfg.EventIDPrefix
	if s.orders, err = newOrderTable(cfg.Dialect); err != nil {
		return nil, err
	}
	s.observer = cfg.Observer
	if s.events, err = sqlstore.NewOutboxStore(cfg.DB, &sqlstore.OutboxConfig{Dialect: cfg.Dialect, IDPrefix: cfg.EventIDPrefix}); err != nil {
		return nil, err
	}
	if s.tokenStore, err = sqlstore.NewTokenStore(cfg.DB, &sqlstore.Config{Dialect: cfg.Dialect, Logger: cfg.Logger}); err != nil {
		s.events.Close()
		return nil, err
	}
	if s.journal, err = sqlstore.NewStepJournal(cfg.DB, &sqlstore.Config{Dialect: cfg.Dialect, Logger: cfg.Logger}); err != nil {
		s.Close()
		return nil, err
	}
	if s.tokens, err = token.New(s.tokenStore, nil); err != nil {
		s.Close()
		return nil, err
	}
	if cfg.StoreName == "" {
		cfg.StoreName = cfg.Dialect.String()
	}
	idm, err := idemhttp.New(&idemhttp.Config{
		Store:     cfg.Store,
		Scope:     scopeOf,
		Lease:     cfg.Lease,
		Wait:      cfg.Wait,
		Logger:    cfg.Logger,
		Observer:  cfg.Observer,
		StoreName: cfg.StoreName,
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.newRunner(cfg); err != nil {
		s.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	mux.Handle("POST /orders", s.authenticated(idm.Handler(http.HandlerFunc(s.createOrder))))
	mux.Handle("GET /orders", s.authenticated(http.HandlerFunc(s.listOrders)))
	mux.Handle("GET /orders/{order_no}", pageOrAPI(s.pageAuthenticated(http.HandlerFunc(s.orderPage)), s.authenticated(http.HandlerFunc(s.getOrder))))
	mux.Handle("POST /tokens", s.authenticated(http.HandlerFunc(s.issueToken)))
	mux.HandleFunc("GET /{$}", s.home)
	mux.Handle("GET /static/", staticFiles)
	mux.Handle("POST /checkout", s.formPosts(s.pageAuthenticated(http.HandlerFunc(s.checkout))))
	mux.Handle("POST /orders/{order_no}/pay", pageOrAPI(s.formPosts(s.pageAuthenticated(http.HandlerFunc(s.payPage))), http.HandlerFunc(pageOnly)))
	mux.HandleFunc("GET /products", s.listProducts)
	payments, err := s.paymentCallbackHandler(idm)
	if err != nil {
		return nil, err
	}
	mux.Handle("POST /payments/callback", payments)
	// The order page's Cancel button posts a form here (with the uid
	// cookie) and gets 303 back to the page; API clients (X-User-ID) get JSON.
	mux.Handle("POST /orders/{order_no}/cancel", pageOrAPI(s.formPosts(s.pageAuthenticated(http.HandlerFunc(s.cancelPage))),
		s.authenticated(http.HandlerFunc(s.cancelHandler))))
	mux.Handle("POST /orders/{order_no}/refunds", s.authenticated(idm.Handler(http.HandlerFunc(s.refundHandler))))
	mux.Handle("POST /orders/{order_no}/card-checkout", s.authenticated(idm.Handler(http.HandlerFunc(s.cardCheckoutHandler))))
	mux.Handle("POST /coupons/{id}/claim", s.authenticated(http.HandlerFunc(s.claimHandler)))
	mux.Handle("GET /users/me/coupons", s.authenticated(http.HandlerFunc(s.listClaims)))
	mux.Handle("GET /users/me/points", s.authenticated(http.HandlerFunc(s.pointsHandler)))
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("/", notFound)
	s.handler = mux
	return s, nil
}

// newRunner creates the runner of the refund operations, over the shop's
// step journal and a Guard of cfg.Store, and defines the refund on it.
func (s *Shop) newRunner(cfg Config) error {
	g, err := idem.NewGuard(cfg.Store, &idem.GuardConfig{Lease: cfg.Lease, Logger: cfg.Logger, Observer: cfg.Observer, StoreName: cfg.StoreName})
	if err != nil {
		return fmt.Errorf("shop: %w", err)
	}
	var sc steps.Config
	if cfg.Steps != nil {
		sc = *cfg.Steps
	}
	if sc.Logger == nil {
		sc.Logger = cfg.Logger
	}
	if s.runner, err = steps.New(g, s.journal, &sc); err != nil {
		return fmt.Errorf("shop: %w", err)
	}
	if s.refund, err = s.defineRefund(s.runner); err != nil {
		return fmt.Errorf("shop: %w", err)
	}
	if s.cardOp, err = s.defineCheckout(s.runner); err != nil {
		return fmt.Errorf("shop: %w", err)
	}
	return nil
}

// Runner is the runner of the shop's operations of steps (refunds): start
// its completer (Runner().Start) in every instance, so that refunds whose
// client stopped retrying finish, and Close it before the database closes.
func (s *Shop) Runner() *steps.Runner { return s.runner }

// Close releases what the Shop prepared on its database (the submit
// tokens', the outbox's and the step journal's statements); it does not
// close the database nor stop the completer (Runner().Close). Requests
// served after Close fail. It is idempotent.
func (s *Shop) Close() error {
	errs := []error{s.tokenStore.Close(), s.events.Close()}
	if s.journal != nil {
		errs = append(errs, s.journal.Close())
	}
	return errors.Join(errs...)
}

// Outbox is the outbox the shop writes its order events to, for a relay
// (outbox.NewRelay) to publish.
func (s *Shop) Outbox() *sqlstore.OutboxStore { return s.events }

// ServeHTTP serves the shop's API.
func (s *Shop) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Order is an order as the API shows it.
type Order struct {
	OrderNo     string `json:"order_no"`
	UserID      int64  `json:"user_id"`
	SKU         string `json:"sku"`
	Quantity    int    `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
	// CouponID is the coupon the order used, if any.
	CouponID  int64  `json:"coupon_id,omitempty"`
	Status    string `json:"status"`
	Version   int64  `json:"version"`
	CreatedAt string `json:"created_at"`
}

// Order statuses: an order waits for its payment (CHARGING while a card
// checkout charges it), then is paid (and may
// be refunded: REFUNDING while the payment provider refunds it), or is
// cancelled by its owner or closed unpaid by the shop.
const (
	StatusWaitPay   = "WAIT_PAY"
	StatusCharging  = "CHARGING"
	StatusPaid      = "PAID"
	StatusCancelled = "CANCELLED"
	StatusClosed    = "CLOSED"
	StatusRefunding = "REFUNDING"
	StatusRefunded  = "REFUNDED"
)

// Limits of an order request.
const (
	MaxQuantity = 1000
	maxSKULen   = 64
)

var skuPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// orderNoPattern matches every order number the shop issues (newOrderNo)
// and fits its column; GET /orders/{order_no} looks up nothing else.
var orderNoPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

type userKey struct{}

func userFrom(ctx context.Context) int64 {
	id, _ := ctx.Value(userKey{}).(int64)
	return id
}

// scopeOf is the idempotency scope: the authenticated user.
func scopeOf(r *http.Request) (string, error) {
	id := userFrom(r.Context())
	if id <= 0 {
		return "", errors.New("shop: no authenticated user")
	}
	return "user:" + strconv.FormatInt(id, 10), nil
}

// authenticated reads the caller from X-User-ID (a positive integer).
func (s *Shop) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values := r.Header.Values("X-User-ID")
		if len(values) > 1 {
			// Two fields name two callers; neither is more authentic.
			writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request",
				"the request has more than one X-User-ID header field")
			return
		}
		raw := ""
		if len(values) == 1 {
			raw = values[0]
		}
		if raw == "" {
			writeProblem(w, http.StatusUnauthorized, idemhttp.CodeUnauthenticated, "Unauthenticated", "the X-User-ID header is required")
			return
		}
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || id <= 0 || strconv.FormatInt(id, 10) != raw {
			writeProblem(w, http.StatusUnauthorized, idemhttp.CodeUnauthenticated, "Unauthenticated", "X-User-ID must be a positive integer")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, id)))
	})
}

// orderRequest is what POST /orders and POST /checkout ask for.
type orderRequest struct {
	SKU      string
	Quantity int
	// CouponID is the coupon to use, 0 for none.
	CouponID int64
	// OrderNo is the new order's number, chosen before the order is
	// placed (a submit token records it); "" for a new one.
	OrderNo string
}

// parseCreateOrder reads the body of POST /orders: one JSON object with
// the members "sku" (a string), "quantity" (an integer) and optionally
// "coupon_id" (a positive integer, or null for none), each exactly once,
// spelled exactly so. encoding/json alone would accept "SKU" or
// "Quantity" (it matches names case-insensitively) and let the last of two
// equal names win, so a body could be read as another order than the one
// it seems to ask for; such bodies are refused as ambiguous.
func parseCreateOrder(body []byte) (orderRequest, error) {
	const shape = `body must be a JSON object {"sku": string, "quantity": integer, "coupon_id": integer (optional)}`
	members, err := strictObject(body, "sku", "quantity", "coupon_id")
	if err != nil {
		return orderRequest{}, fmt.Errorf("%s: %v", shape, err)
	}
	var req orderRequest
	rawSKU, ok := members["sku"]
	if !ok {
		return orderRequest{}, errors.New("sku is required")
	}
	if string(rawSKU) == "null" || json.Unmarshal(rawSKU, &req.SKU) != nil {
		return orderRequest{}, errors.New("sku must be a string")
	}
	if err := checkSKU(req.SKU); err != nil {
		return orderRequest{}, err
	}
	rawQty, ok := members["quantity"]
	if !ok {
		return orderRequest{}, errors.New("quantity is required")
	}
	if string(rawQty) == "null" || json.Unmarshal(rawQty, &req.Quantity) != nil || req.Quantity < 1 || req.Quantity > MaxQuantity {
		return orderRequest{}, fmt.Errorf("quantity must be an integer from 1 to %d", MaxQuantity)
	}
	if raw, ok := members["coupon_id"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &req.CouponID) != nil || req.CouponID < 1 {
			return orderRequest{}, errors.New("coupon_id must be a positive integer (or null for none)")
		}
	}
	return req, nil
}

// checkSKU checks a SKU's syntax.
func checkSKU(sku string) error {
	if len(sku) == 0 || len(sku) > maxSKULen || !skuPattern.MatchString(sku) {
		return fmt.Errorf("sku must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", maxSKULen)
	}
	return nil
}

// strictObject decodes body, which must hold exactly one JSON object, into
// its members' raw values. Every member name must be one of names, exactly
// (case matters), and appear once; names compare after JSON unescaping, so
// "s\u006bu" is "sku".
func strictObject(body []byte, names ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil {
		return nil, err
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("found %v, not an object", tokenKind(tok))
	}
	members := make(map[string]json.RawMessage, len(names))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := tok.(string)
		if !ok { // Token reports a name that is not a string as a syntax error; this is a safety net
			return nil, fmt.Errorf("member name %v is not a string", tok)
		}
		if !slices.Contains(names, name) {
			for _, n := range names {
				if strings.EqualFold(n, name) {
					return nil, fmt.Errorf("member %q: names are case-sensitive; write %q", name, n)
				}
			}
			return nil, fmt.Errorf("unknown member %q", name)
		}
		if _, dup := members[name]; dup {
			return nil, fmt.Errorf("member %q appears more than once", name)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		members[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	return members, nil
}

// tokenKind names the kind of a JSON token for an error message.
func tokenKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		if tok == json.Delim('[') {
			return "an array"
		}
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
}

func (s *Shop) createOrder(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", "cannot read the body")
		return
	}
	req, err := parseCreateOrder(body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", err.Error())
		return
	}
	submit, err := submitTokenHeader(r)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", err.Error())
		return
	}
	// One business transaction, run again whole under the retry policy:
	// the token, the order and the stored response commit together or
	// not at all, so an attempt that rolled back left nothing behind
	// (CompleteTx may be called again after it).
	var resp idem.Response
	stage := "begin"
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		req := req
		if submit != "" {
			// The token first: a concurrent request with it waits here.
			req.OrderNo = newOrderNo()
			stage = "spend submit token"
			if err := s.spendToken(ctx, tx, userFrom(ctx), submit, req); err != nil {
				return err
			}
		}
		stage = "place order"
		order, err := s.placeOrder(ctx, tx, userFrom(ctx), req)
		if err != nil {
			return err
		}
		stage = "encode order"
		if resp, err = idemhttp.JSONResponse(http.StatusCreated, order); err != nil {
			return err
		}
		resp.Header["Location"] = []string{"/orders/" + order.OrderNo}
		// The stored response commits with the order, or neither does.
		if exec := idemhttp.ExecutionFrom(ctx); exec != nil {
			stage = "complete idempotency record"
			if err := exec.CompleteTx(ctx, tx, resp); err != nil {
				return err
			}
		}
		stage = "commit"
		return nil
	})
	switch {
	case err == nil:
		// The transaction with the stored answer committed: the
		// middleware need not read the record back to know it.
		if exec := idemhttp.ExecutionFrom(ctx); exec != nil {
			exec.Confirm()
		}
	case stage == "complete idempotency record" && errors.Is(err, idem.ErrLeaseLost):
		// Another execution took this key over; its answer will be replayed.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Request in progress",
			"another execution of this request took over; retry to get its answer")
		return
	default:
		s.answerError(w, r, stage, err)
		return
	}
	idemhttp.WriteResponse(w, resp)
}

// placeOrder creates an order of req for user in tx: it reserves the
// stock with one conditional update (never below 0, however many orders
// race for the last items), uses the coupon's claim if req names one
// (UNUSED → USED, once), and inserts the order, WAIT_PAY, for price ×
// quantity minus the coupon's discount (not below 0). A refusal is a
// *problemError: UNKNOWN_SKU, OUT_OF_STOCK, COUPON_NOT_USABLE.
func (s *Shop) placeOrder(ctx context.Context, tx *sql.Tx, user int64, req orderRequest) (Order, error) {
	now := time.Now().UTC()
	if req.OrderNo == "" {
		req.OrderNo = newOrderNo()
	}
	order := Order{
		OrderNo:   req.OrderNo,
		UserID:    user,
		SKU:       req.SKU,
		Quantity:  req.Quantity,
		CouponID:  req.CouponID,
		Status:    StatusWaitPay,
		Version:   1,
		CreatedAt: now.Format(time.RFC3339Nano),
	}
	res, err := tx.ExecContext(ctx, s.q.reserveStock, req.Quantity, req.SKU, req.Quantity)
	if err != nil {
		return Order{}, fmt.Errorf("reserve stock: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return Order{}, fmt.Errorf("reserve stock: %w", err)
	} else if n == 0 {
		var one int
		switch err := tx.QueryRowContext(ctx, s.q.productExists, req.SKU).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			return Order{}, &problemError{http.StatusBadRequest, CodeUnknownSKU, "Unknown SKU", fmt.Sprintf("no product has the sku %q; GET /products lists them", req.SKU)}
		case err != nil:
			return Order{}, fmt.Errorf("read product: %w", err)
		}
		return Order{}, &problemError{http.StatusConflict, CodeOutOfStock, "Out of stock", fmt.Sprintf("fewer than %d of %s are left", req.Quantity, req.SKU)}
	}
	var price int64
	if err := tx.QueryRowContext(ctx, s.q.productPrice, req.SKU).Scan(&price); err != nil {
		return Order{}, fmt.Errorf("read price: %w", err)
	}
	amount := price * int64(req.Quantity)
	var coupon sql.NullInt64
	if req.CouponID != 0 {
		res, err := tx.ExecContext(ctx, s.q.useClaim, order.OrderNo, user, req.CouponID)
		if err != nil {
			return Order{}, fmt.Errorf("use coupon: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return Order{}, fmt.Errorf("use coupon: %w", err)
		} else if n == 0 {
			return Order{}, &problemError{http.StatusConflict, CodeCouponNotUsable, "Coupon not usable",
				fmt.Sprintf("you have no unused claim of coupon %d (claim it with POST /coupons/%d/claim; a claim is used by one order)", req.CouponID, req.CouponID)}
		}
		var discount int64
		if err := tx.QueryRowContext(ctx, s.q.couponDiscount, req.CouponID).Scan(&discount); err != nil {
			return Order{}, fmt.Errorf("read coupon: %w", err)
		}
		amount = max(0, amount-discount)
		coupon = sql.NullInt64{Int64: req.CouponID, Valid: true}
	}
	order.AmountCents = amount
	if _, err := tx.ExecContext(ctx, s.q.insertOrder,
		order.OrderNo, order.UserID, order.SKU, order.Quantity, order.AmountCents, coupon, order.Quantity,
		order.Status, order.CreatedAt); err != nil {
		return Order{}, fmt.Errorf("insert order: %w", err)
	}
	return order, nil
}

// scanOrder reads a row of orderColumns.
func scanOrder(row interface{ Scan(...any) error }) (Order, error) {
	var o Order
	var coupon sql.NullInt64
	err := row.Scan(&o.OrderNo, &o.UserID, &o.SKU, &o.Quantity, &o.AmountCents, &coupon, &o.Status, &o.Version, &o.CreatedAt)
	o.CouponID = coupon.Int64
	return o, err
}

func (s *Shop) listProducts(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q.listProducts)
	if err != nil {
		s.readFailed(ctx, w, r, "list products", err)
		return
	}
	defer rows.Close()
	products := []Product{}
	for rows.Next() {
		var p Product
		if err := rows.Scan(&p.SKU, &p.Name, &p.PriceCents, &p.Stock); err != nil {
			s.readFailed(ctx, w, r, "list products", err)
			return
		}
		products = append(products, p)
	}
	if err := rows.Err(); err != nil {
		s.readFailed(ctx, w, r, "list products", err)
		return
	}
	writeJSON(w, http.StatusOK, products)
}

func (s *Shop) getOrder(w http.ResponseWriter, r *http.Request) {
	no := r.PathValue("order_no")
	if !orderNoPattern.MatchString(no) {
		// No order has this number; and PostgreSQL would refuse invalid
		// UTF-8 or a NUL byte in the query's parameter.
		writeProblem(w, http.StatusNotFound, CodeNotFound, "Not found", "no such order")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
	defer cancel()
	o, err := scanOrder(s.db.QueryRowContext(ctx, s.q.getOrder, no, userFrom(r.Context())))
	if errors.Is(err, sql.ErrNoRows) {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "Not found", "no such order")
		return
	}
	if err != nil {
		s.readFailed(ctx, w, r, "get order", err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// Listing limits.
const (
	defaultListLimit = 50
	maxListLimit     = 500
)

func (s *Shop) listOrders(w http.ResponseWriter, r *http.Request) {
	limit := defaultListLimit
	if raw := r.URL.Query().Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > maxListLimit {
			writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request",
				fmt.Sprintf("limit must be an integer from 1 to %d", maxListLimit))
			return
		}
		limit = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q.listOrders,
		userFrom(r.Context()), limit)
	if err != nil {
		s.readFailed(ctx, w, r, "list orders", err)
		return
	}
	defer rows.Close()
	orders := []Order{}
	for rows.Next() {
		o, err := scanOrder(rows)
		if err != nil {
			s.readFailed(ctx, w, r, "list orders", err)
			return
		}
		orders = append(orders, o)
	}
	if err := rows.Err(); err != nil {
		s.readFailed(ctx, w, r, "list orders", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"orders": orders})
}

// readQueryTimeout bounds a read of the shop's rows (GET /orders and GET
// /orders/{order_no}): a database that stops answering, its packets
// swallowed, would otherwise hold the request, its goroutine and a pooled
// connection for as long as the client waits.
const readQueryTimeout = 10 * time.Second

// readFailed answers a failed read: 503 UNHEALTHY with Retry-After when
// the database did not answer within readQueryTimeout, 500 otherwise.
func (s *Shop) readFailed(ctx context.Context, w http.ResponseWriter, r *http.Request, what string, err error) {
	if r.Context().Err() == nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		s.log.ErrorContext(r.Context(), "shop: the database did not answer in time", "op", what, "timeout", readQueryTimeout, "error", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, CodeUnhealthy, "Unhealthy",
			fmt.Sprintf("the database did not answer within %v", readQueryTimeout))
		return
	}
	s.fail(w, r, what, err)
}

func (s *Shop) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.db.PingContext(ctx); err != nil {
		s.log.WarnContext(ctx, "shop: health check failed", "error", err)
		writeProblem(w, http.StatusServiceUnavailable, CodeUnhealthy, "Unhealthy", "the database does not answer")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// notFound answers what no route serves, as problem+json: 405 with Allow
// for a known path, 404 otherwise.
func notFound(w http.ResponseWriter, r *http.Request) {
	allow := ""
	switch p := r.URL.Path; {
	case p == "/orders":
		allow = "GET, POST"
	case p == "/healthz", p == "/products", p == "/":
		allow = "GET"
	case p == "/tokens", p == "/checkout", p == "/payments/callback":
		allow = "POST"
	case strings.HasPrefix(p, "/orders/") && p != "/orders/" && !strings.Contains(p[len("/orders/"):], "/"):
		// /orders/{order_no}; "/orders/" names no order.
		allow = "GET"
	case pathHasSegments(p, "orders", "", "cancel"), pathHasSegments(p, "orders", "", "refunds"), pathHasSegments(p, "orders", "", "card-checkout"), pathHasSegments(p, "coupons", "", "claim"),
		pathHasSegments(p, "orders", "", "pay"):
		allow = "POST"
	case p == "/users/me/coupons":
		allow = "GET"
	}
	if allow != "" {
		w.Header().Set("Allow", allow)
		writeProblem(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "Method not allowed", r.Method+" is not allowed here; allowed: "+allow)
		return
	}
	writeProblem(w, http.StatusNotFound, CodeNotFound, "Not found", "no such resource")
}

// fail answers 500 INTERNAL and logs why: at Error level, unless the
// request's context had ended (the client hung up, or the execution lost
// its lease), which no operator can act on and any client can cause.
func (s *Shop) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	ctx := r.Context()
	switch cause := context.Cause(ctx); {
	case cause == nil:
		s.log.ErrorContext(ctx, "shop: request failed", "op", what, "error", err)
	case errors.Is(cause, idem.ErrLeaseLost):
		s.log.WarnContext(ctx, "shop: request ended: its execution lost the lease", "op", what, "error", err)
	default:
		s.log.InfoContext(ctx, "shop: request ended: its context was cancelled (the client went away)", "op", what, "error", err, "cause", cause)
	}
	writeProblem(w, http.StatusInternalServerError, CodeInternal, "Internal error", "the request failed; retry with the same Idempotency-Key")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "Internal error", "the answer could not be encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// newOrderNo returns a random order number, e.g. "ord_3f9c0a5e1b2d4c6f8a7e9b10".
func newOrderNo() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "ord_" + hex.EncodeToString(b[:])
}

// answerError answers err: a *problemError with its problem, anything else
// as a failure (500).
func (s *Shop) answerError(w http.ResponseWriter, r *http.Request, what string, err error) {
	var pe *problemError
	if errors.As(err, &pe) {
		writeProblem(w, pe.status, pe.code, pe.title, pe.detail)
		return
	}
	var dup *duplicateSubmissionError
	if errors.As(err, &dup) {
		writeDuplicateSubmission(w, dup)
		return
	}
	s.fail(w, r, what, err)
}
