package admin

import (
	"context"
	"embed"
	"html/template"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/steps"
)

//go:embed assets
var assets embed.FS

//go:embed page.html
var pageHTML string

var tmpl = template.Must(template.New("admin").Funcs(template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"rows": func(rows []recordRow, canEvict bool, csrf string) any {
		return struct {
			Rows     []recordRow
			CanEvict bool
			CSRF     string
		}{rows, canEvict, csrf}
	},
	"msgs": func(rows []messageRow, retry, canRetry bool, csrf string) any {
		return struct {
			Rows            []messageRow
			Retry, CanRetry bool
			CSRF            string
		}{rows, retry, canRetry, csrf}
	},
	"ops": func(rows []opRow, csrf string) any {
		return struct {
			Rows []opRow
			CSRF string
		}{rows, csrf}
	},
	"cents": func(c int64) string {
		sign := ""
		if c < 0 {
			sign, c = "-", -c
		}
		return sign + strconv.FormatInt(c/100, 10) + "." + strconv.FormatInt(c%100/10, 10) + strconv.FormatInt(c%10, 10)
	},
}).Parse(pageHTML))

type loginPage struct {
	Name   string
	Failed bool
	// Wait: the login was refused by the limits; seconds to wait.
	Wait int
}

type confirmPage struct {
	Name, CSRF, Action, Title, Button string
	Lines                             []string
	Fields                            map[string]string
}

// recordRow is a record as the page shows it.
type recordRow struct {
	Scope, Key       string // quoted for display
	Scope64, Key64   string
	Hash, Status     string
	Fence            int64
	Created, Expires time.Time
	LeaseUntil       time.Time
	LeaseEnded       bool
	Response         string
}

type messageRow struct {
	Group, ID     string // quoted for display
	Group64, ID64 string
	Hash, Status  string
	Attempts      int
	LastError     string
	LeaseUntil    time.Time
	Updated       time.Time
	LeaseEnded    bool
}

// opRow is an operation of steps as the page shows it.
type opRow struct {
	Name, Scope, Key string // quoted for display
	Scope64, Key64   string
	Hash, State      string
	Attempts         int
	LastError        string // quoted and cut
	NextAt, Updated  time.Time
	Due              bool
}

type mainPage struct {
	Name     string
	CSRF     string
	Bearer   bool
	Done     string
	Now      time.Time
	Counters []Count

	CanEvict    bool
	Listing     bool
	RecordsNote string
	RecordsErr  string
	InFlight    []recordRow
	Oldest      []recordRow

	Inbox       bool
	CanRetry    bool
	MessagesErr string
	Stuck       []messageRow
	Dead        []messageRow

	OpsOn      bool
	OpsErr     string
	DeadOps    []opRow
	WaitingOps []opRow

	HeldOn   bool
	HeldNote string
	HeldErr  string
	Held     []Held
}

var hashRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func (h *Handler) page(w http.ResponseWriter, r *http.Request, u who) {
	ctx, now := r.Context(), h.cfg.Now()
	p := mainPage{Name: h.cfg.Name, CSRF: csrfOf(u), Bearer: u.sess == nil, Now: now, CanEvict: h.cfg.Store != nil,
		Listing: h.cfg.Records != nil, RecordsNote: h.cfg.RecordsNote,
		Inbox: h.cfg.Messages != nil, CanRetry: h.cfg.Retry != nil, OpsOn: h.cfg.Operations != nil, HeldOn: h.cfg.Held != nil, HeldNote: h.cfg.HeldNote}
	if ref := r.URL.Query().Get("ref"); hashRE.MatchString(ref) {
		switch r.URL.Query().Get("done") {
		case "evicted":
			p.Done = "Record " + ref + " evicted."
		case "retried":
			p.Done = "Dead message " + ref + " retried: it is published again."
		case "op-retried":
			p.Done = "Operation " + ref + " retried: it is due now, for the completer's next pass."
		}
	}
	if h.cfg.Counters != nil {
		p.Counters = h.cfg.Counters.Snapshot()
	}
	if h.cfg.Records != nil {
		var err error
		if p.InFlight, err = h.records(ctx, idem.StatusProcessing, now); err == nil {
			p.Oldest, err = h.records(ctx, "", now)
		}
		if err != nil {
			p.RecordsErr = err.Error()
			h.log.WarnContext(ctx, "admin: list records", "error", err)
		}
	}
	if h.cfg.Messages != nil {
		var err error
		p.Stuck, p.Dead, err = h.messages(ctx, now)
		if err != nil {
			p.MessagesErr = err.Error()
			h.log.WarnContext(ctx, "admin: list consume records", "error", err)
		}
	}
	if h.cfg.Operations != nil {
		var err error
		if p.DeadOps, err = h.operations(ctx, steps.StateDead, now); err == nil {
			p.WaitingOps, err = h.operations(ctx, steps.StateWaiting, now)
		}
		if err != nil {
			p.OpsErr = err.Error()
			h.log.WarnContext(ctx, "admin: list operations", "error", err)
		}
	}
	if h.cfg.Held != nil {
		var err error
		if p.Held, err = h.cfg.Held(ctx, h.cfg.Limit); err != nil {
			p.HeldErr = err.Error()
			h.log.WarnContext(ctx, "admin: list held payments", "error", err)
		}
	}
	h.render(w, http.StatusOK, "main", p)
}

func (h *Handler) records(ctx context.Context, status idem.Status, now time.Time) ([]recordRow, error) {
	recs, err := h.cfg.Records.List(ctx, status, h.cfg.Limit)
	if err != nil {
		return nil, err
	}
	rows := make([]recordRow, 0, len(recs))
	for _, rec := range recs {
		row := recordRow{Scope: quote(rec.Scope), Key: quote(rec.Key), Scope64: enc(rec.Scope), Key64: enc(rec.Key),
			Hash: idem.HashKey(rec.Scope, rec.Key), Status: string(rec.Status), Fence: rec.Fence,
			Created: rec.CreatedAt, Expires: rec.ExpiresAt}
		if rec.Status == idem.StatusProcessing {
			row.LeaseUntil, row.LeaseEnded = rec.LeaseUntil, !rec.LeaseUntil.After(now)
		}
		if rec.Response != nil {
			row.Response = strconv.Itoa(rec.Response.StatusCode)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// operations lists the operations of steps in state.
func (h *Handler) operations(ctx context.Context, state steps.State, now time.Time) ([]opRow, error) {
	ops, err := h.cfg.Operations.List(ctx, state, h.cfg.Limit)
	if err != nil {
		return nil, err
	}
	rows := make([]opRow, 0, len(ops))
	for _, op := range ops {
		rows = append(rows, opRow{Name: quote(op.Name), Scope: quote(op.Scope), Key: quote(op.Key), Scope64: enc(op.Scope), Key64: enc(op.Key),
			Hash: idem.HashKey(op.Scope, op.Key), State: string(op.State), Attempts: op.Attempts, LastError: quote(op.LastError),
			NextAt: op.NextAt, Updated: op.UpdatedAt, Due: !op.NextAt.IsZero() && !op.NextAt.After(now)})
	}
	return rows, nil
}

// messages lists the stuck consume records (failed ones, and processing
// ones whose lease ended: their consumer died) and the dead ones.
func (h *Handler) messages(ctx context.Context, now time.Time) (stuck, dead []messageRow, err error) {
	row := func(r inbox.Record) messageRow {
		m := messageRow{Group: quote(r.Group), ID: quote(r.ID), Group64: enc(r.Group), ID64: enc(r.ID),
			Hash: idem.HashKey("", r.ID), Status: string(r.Status), Attempts: r.Attempts,
			LastError: r.LastError, Updated: r.UpdatedAt}
		if r.Status == inbox.StatusProcessing {
			m.LeaseUntil, m.LeaseEnded = r.LeaseUntil, !r.LeaseUntil.After(now)
		}
		return m
	}
	for _, st := range []inbox.Status{inbox.StatusProcessing, inbox.StatusFailed, inbox.StatusDead} {
		recs, err := h.cfg.Messages.List(ctx, st, h.cfg.Limit)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range recs {
			switch {
			case st == inbox.StatusDead:
				dead = append(dead, row(r))
			case st == inbox.StatusFailed || !r.LeaseUntil.After(now):
				stuck = append(stuck, row(r))
			}
		}
	}
	return stuck, dead, nil
}

func (h *Handler) render(w http.ResponseWriter, status int, name string, data any) {
	var b strings.Builder
	if err := tmpl.ExecuteTemplate(&b, name, data); err != nil {
		h.log.Error("admin: render", "page", name, slog.Any("error", err))
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// quote shows s as it is when it is printable UTF-8, quoted (Go syntax)
// otherwise, cut at 200 bytes.
func quote(s string) string {
	printable := utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0
	if !printable {
		s = strconv.Quote(s)
	}
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}
