package shop

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/sqlstore"
)

// The shop's pages: a checkout page (GET /) and an order page (GET
// /orders/{order_no} asked for as text/html), served from templates
// embedded in the binary, with html/template escaping every value.
//
// Identity on pages is the API's demo identity carried in a cookie, uid:
// GET /?uid=N signs in as user N; a GET without the cookie is user 1
// (and sets it). Form posts need the cookie. It is SameSite=Lax, so a
// form posted from another site arrives without it and is refused; and
// the form posts pass through net/http's CrossOriginProtection, which
// refuses a cross-origin post by its Sec-Fetch-Site or Origin header.
// The checkout form's submit token is bound to the user as well. None of
// this is authentication: anyone may set uid to any number, exactly as
// any API client may send any X-User-ID.

//go:embed web
var webFiles embed.FS

// pageTemplates are the pages, each parsed with the layout.
var pageTemplates = func() map[string]*template.Template {
	funcs := template.FuncMap{"money": money}
	m := map[string]*template.Template{}
	for _, name := range []string{"checkout", "order", "error"} {
		m[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(webFiles, "web/layout.html", "web/"+name+".html"))
	}
	return m
}()

// staticFiles serves web/static (the stylesheet and the script).
var staticFiles = func() http.Handler {
	sub, err := fs.Sub(webFiles, "web/static")
	if err != nil {
		panic(err)
	}
	return http.StripPrefix("/static/", http.FileServerFS(sub))
}()

// money formats cents as units with two decimals: 1299 → "12.99".
func money(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s%d.%02d", sign, cents/100, cents%100)
}

const (
	// uidCookie carries the page identity.
	uidCookie = "uid"
	// defaultPageUser is the identity of a page visitor without the cookie.
	defaultPageUser = 1
	// signedIn is the query of the redirect that follows setting the
	// cookie: the visit that comes back with it and without the cookie
	// is a browser that refuses cookies, told so instead of being sent
	// round again.
	signedIn = "signed_in"
	// maxFormBytes bounds a form post's body.
	maxFormBytes = 16 << 10
	// recentOrders is how many of the user's orders the checkout page lists.
	recentOrders = 10
	// simulatedPaymentTimeout bounds the order page's simulated payment.
	simulatedPaymentTimeout = 30 * time.Second
)

// webQueries are the statements of the pages.
type webQueries struct {
	unusedClaims, existsOrder string
}

func newWebQueries(d sqlstore.Dialect) webQueries {
	return webQueries{
		unusedClaims: rebind(d, `SELECT c.id, c.name, c.discount_cents FROM shop_coupon_claims cl
			JOIN shop_coupons c ON c.id = cl.coupon_id
			WHERE cl.user_id = ? AND cl.status = 'UNUSED' ORDER BY c.id`),
		existsOrder: rebind(d, `SELECT 1 FROM shop_orders WHERE order_no = ?`),
	}
}

// isPageRequest reports whether r comes from a page in a browser rather
// than from an API client: it carries no X-User-ID, and it is a GET or
// HEAD that accepts text/html, or a POST of an HTML form
// (application/x-www-form-urlencoded or multipart/form-data).
func isPageRequest(r *http.Request) bool {
	if len(r.Header.Values("X-User-ID")) > 0 {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return acceptsHTML(r.Header.Values("Accept"))
	case http.MethodPost:
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		return mt == "application/x-www-form-urlencoded" || mt == "multipart/form-data"
	}
	return false
}

// acceptsHTML reports whether Accept lists text/html (q not 0).
func acceptsHTML(accept []string) bool {
	for _, field := range accept {
		for _, rng := range strings.Split(field, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(rng))
			if err != nil || mt != "text/html" {
				continue
			}
			if q, ok := params["q"]; ok {
				if v, err := strconv.ParseFloat(q, 64); err == nil && v == 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}

// pageOrAPI serves page requests (isPageRequest) with page and the others
// with api: one path answers a browser with HTML and an API client with
// JSON, each with its own identity (the uid cookie, X-User-ID).
func pageOrAPI(page, api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isPageRequest(r) {
			page.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// pageUserFrom parses the uid cookie; 0 when absent or not a positive
// integer in canonical form. Of several uid cookies (a parent domain's
// beside the shop's own), the first that is a user counts.
func pageUserFrom(r *http.Request) int64 {
	for _, c := range r.CookiesNamed(uidCookie) {
		if id := parseUserID(c.Value); id != 0 {
			return id
		}
	}
	return 0
}

func parseUserID(raw string) int64 {
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != raw {
		return 0
	}
	return id
}

func setUIDCookie(w http.ResponseWriter, user int64) {
	http.SetCookie(w, &http.Cookie{
		Name: uidCookie, Value: strconv.FormatInt(user, 10), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, MaxAge: 30 * 24 * 3600,
	})
}

// pageAuthenticated is authenticated for pages: the caller is the uid
// cookie's user. A GET without the cookie is user 1 and gets the cookie;
// a form post without it is refused (401, as a page): a post from another
// site arrives without the SameSite=Lax cookie.
func (s *Shop) pageAuthenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := pageUserFrom(r)
		if user == 0 {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				s.errorPage(w, r, http.StatusUnauthorized, "Not signed in",
					"This form needs the shop's cookie: open the shop's page and submit from there.", "/")
				return
			}
			user = defaultPageUser
			setUIDCookie(w, user)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// formPosts guards the pages' form posts against cross-origin requests:
// net/http's CrossOriginProtection (Sec-Fetch-Site, or Origin against
// Host), answered as a page.
func (s *Shop) formPosts(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.errorPage(w, r, http.StatusForbidden, "Cross-origin request refused",
			"This form was posted from another site; the shop takes its forms from its own pages only.", "/")
	}))
	return cop.Handler(next)
}

// checkoutPage is the data of checkout.html.
type checkoutPage struct {
	User     int64
	Products []Product
	Coupons  []Coupon
	Orders   []Order
	Token    string
	Expires  string
}

// home serves GET /: ?uid=N signs in as user N (the cookie, then 303 to
// /?signed_in=1); otherwise the checkout page with a fresh submit token.
// A visitor without the cookie is signed in as user 1 (the cookie, then
// 303 to /?signed_in=1) and gets the page, and its token, on the
// redirect: a client that keeps no cookies (a crawler, a script in a
// loop) gets no token, so anonymous GETs cannot fill idem_tokens. A
// browser that refuses cookies comes back from that redirect without
// the cookie, and gets a page saying the shop needs it (400), not
// another redirect: no loop.
func (s *Shop) home(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("uid") {
		user := parseUserID(q.Get("uid"))
		if user == 0 {
			s.errorPage(w, r, http.StatusBadRequest, "Invalid user", "uid must be a positive integer, as in /?uid=2.", "/")
			return
		}
		setUIDCookie(w, user)
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "/?"+signedIn+"=1", http.StatusSeeOther)
		return
	}
	if pageUserFrom(r) == 0 {
		if q.Has(signedIn) {
			s.errorPage(w, r, http.StatusBadRequest, "Cookies needed",
				"The shop keeps who you are in a cookie, and your browser did not send it back. Allow cookies for this site, then open the shop again.", "/")
			return
		}
		setUIDCookie(w, defaultPageUser)
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "/?"+signedIn+"=1", http.StatusSeeOther)
		return
	}
	s.pageAuthenticated(http.HandlerFunc(s.checkoutPage)).ServeHTTP(w, r)
}

// checkoutPage renders the checkout page with a fresh submit token.
func (s *Shop) checkoutPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
	defer cancel()
	user := userFrom(r.Context())
	page := checkoutPage{User: user}
	var err error
	if page.Products, err = s.products(ctx); err != nil {
		s.pageFailed(w, r, "list products", err)
		return
	}
	if page.Coupons, err = s.unusedCoupons(ctx, user); err != nil {
		s.pageFailed(w, r, "list coupons", err)
		return
	}
	if page.Orders, err = s.userOrders(ctx, user, recentOrders); err != nil {
		s.pageFailed(w, r, "list orders", err)
		return
	}
	tok, err := s.tokens.Issue(ctx, userScope(user))
	if err != nil {
		s.pageFailed(w, r, "issue token", err)
		return
	}
	page.Token, page.Expires = tok.ID, tok.ExpiresAt.UTC().Format(time.RFC3339)
	// Not no-store: going back to the page must show the same form, with
	// the same token, so that resubmitting it leads to the same order.
	w.Header().Set("Cache-Control", "private, no-cache")
	s.render(w, r, http.StatusOK, "checkout", page)
}

// checkoutForm parses the form of POST /checkout.
func checkoutForm(r *http.Request) (orderRequest, string, error) {
	if err := r.ParseForm(); err != nil {
		return orderRequest{}, "", errors.New("the form could not be read")
	}
	one := func(name string) (string, error) {
		v := r.PostForm[name]
		if len(v) > 1 {
			return "", fmt.Errorf("the form has %s more than once", name)
		}
		if len(v) == 0 {
			return "", nil
		}
		return strings.TrimSpace(v[0]), nil
	}
	var req orderRequest
	var err error
	if req.SKU, err = one("sku"); err != nil {
		return orderRequest{}, "", err
	}
	if err := checkSKU(req.SKU); err != nil {
		return orderRequest{}, "", err
	}
	qty, err := one("quantity")
	if err != nil {
		return orderRequest{}, "", err
	}
	if req.Quantity, err = strconv.Atoi(qty); err != nil || req.Quantity < 1 || req.Quantity > MaxQuantity {
		return orderRequest{}, "", fmt.Errorf("quantity must be a whole number from 1 to %d", MaxQuantity)
	}
	coupon, err := one("coupon_id")
	if err != nil {
		return orderRequest{}, "", err
	}
	if coupon != "" {
		if req.CouponID = parseUserID(coupon); req.CouponID == 0 {
			return orderRequest{}, "", errors.New("coupon_id must be a positive integer, or empty for none")
		}
	}
	tok, err := one("token")
	if err != nil {
		return orderRequest{}, "", err
	}
	if tok == "" {
		return orderRequest{}, "", errors.New("the form has no submit token; reload the shop's page")
	}
	return req, tok, nil
}

// checkout serves POST /checkout: the checkout form's submission. It
// spends the form's submit token and creates the order in one
// transaction and answers 303 to the order's page; a submission whose
// token was spent already (a double click without scripts, a resubmitted
// form, a reload of the POST) is answered with 303 to the order that
// token created, and creates nothing. A refusal (out of stock, ...) rolls
// back, the token with it: the form may be corrected and sent again.
func (s *Shop) checkout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	req, tok, err := checkoutForm(r)
	if err != nil {
		s.errorPage(w, r, http.StatusBadRequest, "Invalid order", err.Error(), "/")
		return
	}
	ctx := r.Context()
	user := userFrom(ctx)
	order, err := s.placeOrderWithToken(ctx, user, req, tok)
	var dup *duplicateSubmissionError
	var pe *problemError
	switch {
	case errors.As(err, &dup):
		http.Redirect(w, r, "/orders/"+dup.orderNo, http.StatusSeeOther)
	case errors.As(err, &pe) && pe.code == CodeTokenReused:
		// Not led to the first order: this is another one. The first is
		// the user's own, listed on the page the link reloads.
		s.errorPage(w, r, pe.status, "This form was already used",
			"This form was already sent for a different order, so nothing was ordered now. Reload the page to start a new order; your first one is listed there.", "/")
	case errors.As(err, &pe):
		s.errorPage(w, r, pe.status, pe.title, pe.detail, "/")
	case err != nil:
		s.pageFailed(w, r, "checkout", err)
	default:
		http.Redirect(w, r, "/orders/"+order.OrderNo, http.StatusSeeOther)
	}
}

// placeOrderWithToken spends tok and creates the order of req in one
// transaction: the token first, so a concurrent submission of it waits
// for this one (under the retry policy: inTx).
func (s *Shop) placeOrderWithToken(ctx context.Context, user int64, req orderRequest, tok string) (Order, error) {
	var order Order
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		req := req
		req.OrderNo = newOrderNo()
		if err := s.spendToken(ctx, tx, user, tok, req); err != nil {
			return err
		}
		var err error
		order, err = s.placeOrder(ctx, tx, user, req)
		return err
	})
	return order, err
}

// orderPage serves GET /orders/{order_no} to a browser.
func (s *Shop) orderPage(w http.ResponseWriter, r *http.Request) {
	o, ok := s.pageOrder(w, r)
	if !ok {
		return
	}
	w.Header().Set("Cache-Control", "private, no-cache")
	s.render(w, r, http.StatusOK, "order", o)
}

// pageOrder reads the page's order; it answers a 404 page (and false)
// when the user has no such order.
func (s *Shop) pageOrder(w http.ResponseWriter, r *http.Request) (Order, bool) {
	no := r.PathValue("order_no")
	if orderNoPattern.MatchString(no) {
		ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
		defer cancel()
		o, err := scanOrder(s.db.QueryRowContext(ctx, s.q.getOrder, no, userFrom(r.Context())))
		if err == nil {
			return o, true
		}
		if !errors.Is(err, sql.ErrNoRows) {
			s.pageFailed(w, r, "get order", err)
			return Order{}, false
		}
	}
	s.errorPage(w, r, http.StatusNotFound, "No such order", "You have no order with this number.", "/")
	return Order{}, false
}

// payPage serves POST /orders/{order_no}/pay from the order page: the
// simulated payment (shopd sends itself the provider's signed callback,
// three times, as providers do), then 303 back to the order page. The
// payment does not end with the browser's request (a double click without
// scripts aborts the first post), as a real provider's callbacks do not
// (cut off, they would leave the order unpaid for the next click). It is
// bounded by simulatedPaymentTimeout instead.
func (s *Shop) payPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), simulatedPaymentTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	s.orderAction(w, r, "pay", func(ctx context.Context, user int64, no string) error {
		return s.simulatePayment(ctx, user, no)
	})
}

// cancelPage serves POST /orders/{order_no}/cancel from the order page:
// the owner's cancellation, then 303 back to the order page.
func (s *Shop) cancelPage(w http.ResponseWriter, r *http.Request) {
	s.orderAction(w, r, "cancel", func(ctx context.Context, user int64, no string) error {
		_, err := s.cancelOrder(ctx, user, no)
		return err
	})
}

// orderAction runs act on the page's order and answers 303 to the
// order's page, or an error page.
func (s *Shop) orderAction(w http.ResponseWriter, r *http.Request, what string, act func(context.Context, int64, string) error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.errorPage(w, r, http.StatusBadRequest, "Invalid form", "The form could not be read.", "/")
		return
	}
	o, ok := s.pageOrder(w, r)
	if !ok {
		return
	}
	back := "/orders/" + o.OrderNo
	err := act(r.Context(), o.UserID, o.OrderNo)
	var pe *problemError
	switch {
	case errors.As(err, &pe):
		s.errorPage(w, r, pe.status, pe.title, pe.detail, back)
	case err != nil:
		s.pageFailed(w, r, what, err)
	default:
		http.Redirect(w, r, back, http.StatusSeeOther)
	}
}

// errorPageData is the data of error.html.
type errorPageData struct {
	Status        int
	Title, Detail string
	Back          string
}

// errorPage answers a refusal as a readable page with a link back.
func (s *Shop) errorPage(w http.ResponseWriter, r *http.Request, status int, title, detail, back string) {
	w.Header().Set("Cache-Control", "no-store")
	s.render(w, r, status, "error", errorPageData{Status: status, Title: title, Detail: detail, Back: back})
}

// pageFailed answers a failure as a page (500) and logs it.
func (s *Shop) pageFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.ErrorContext(r.Context(), "shop: page failed", "op", what, "error", err)
	s.errorPage(w, r, http.StatusInternalServerError, "Something went wrong",
		"The shop could not serve this page; try again in a moment.", "/")
}

// render executes a page into a buffer first, so a template error is a
// 500 rather than half a page.
func (s *Shop) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pageTemplates[name].Execute(&buf, data); err != nil {
		s.log.ErrorContext(r.Context(), "shop: page template failed", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// products lists the catalogue.
func (s *Shop) products(ctx context.Context) ([]Product, error) {
	rows, err := s.db.QueryContext(ctx, s.q.listProducts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Product
	for rows.Next() {
		var p Product
		if err := rows.Scan(&p.SKU, &p.Name, &p.PriceCents, &p.Stock); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// unusedCoupons lists the coupons user has claimed and not used.
func (s *Shop) unusedCoupons(ctx context.Context, user int64) ([]Coupon, error) {
	rows, err := s.db.QueryContext(ctx, s.web.unusedClaims, user)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Coupon
	for rows.Next() {
		var c Coupon
		if err := rows.Scan(&c.ID, &c.Name, &c.DiscountCents); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// userOrders lists user's newest orders.
func (s *Shop) userOrders(ctx context.Context, user int64, limit int) ([]Order, error) {
	rows, err := s.db.QueryContext(ctx, s.q.listOrders, user, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Order
	for rows.Next() {
		o, err := scanOrder(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// pageOnly answers an API request for a page's action (the simulated
// payment): 404, the API has no such resource.
func pageOnly(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, http.StatusNotFound, CodeNotFound, "Not found",
		"no such resource: this action is a form post of the shop's order page")
}
