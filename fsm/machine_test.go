package fsm

import (
	"strings"
	"testing"
)

// orderDef is the order machine of the tests: a fresh copy per call.
func orderDef() *Definition {
	return &Definition{
		States:  []State{"NEW", "WAIT_PAY", "PAID", "SHIPPED", "CANCELLED"},
		Initial: "NEW",
		Final:   []State{"SHIPPED", "CANCELLED"},
		Transitions: []Transition{
			{Name: "submit", From: []State{"NEW"}, To: "WAIT_PAY"},
			{Name: "pay", From: []State{"WAIT_PAY"}, To: "PAID"},
			{Name: "ship", From: []State{"PAID"}, To: "SHIPPED"},
			{Name: "cancel", From: []State{"NEW", "WAIT_PAY"}, To: "CANCELLED"},
		},
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*Definition)
		want   string // in the error
	}{
		{"no states", func(d *Definition) { d.States = nil }, "no states"},
		{"empty state", func(d *Definition) { d.States = append(d.States, "") }, "empty state"},
		{"control character", func(d *Definition) { d.States = append(d.States, "A\nB") }, "control character"},
		{"not UTF-8", func(d *Definition) { d.States = append(d.States, "\xff") }, "not UTF-8"},
		{"long state", func(d *Definition) { d.States = append(d.States, State(strings.Repeat("x", 256))) }, "longer than 255"},
		{"state twice", func(d *Definition) { d.States = append(d.States, "PAID") }, `"PAID" is listed twice`},
		{"no initial", func(d *Definition) { d.Initial = "" }, "no initial state"},
		{"unknown initial", func(d *Definition) { d.Initial = "DRAFT" }, `initial state "DRAFT" is not among`},
		{"unknown final", func(d *Definition) { d.Final = append(d.Final, "LOST") }, `final state "LOST" is not among`},
		{"final twice", func(d *Definition) { d.Final = append(d.Final, "SHIPPED") }, `final state "SHIPPED" is listed twice`},
		{"no name", func(d *Definition) { d.Transitions[0].Name = "" }, "has no name"},
		{"bad name", func(d *Definition) { d.Transitions[0].Name = "pay now" }, `"pay now"`},
		{"name twice", func(d *Definition) { d.Transitions[1].Name = "submit" }, `"submit" is declared twice`},
		{"unknown target", func(d *Definition) { d.Transitions[1].To = "PAYED" }, `target "PAYED" is not among`},
		{"unknown source", func(d *Definition) { d.Transitions[1].From = []State{"WAITING"} }, `source "WAITING" is not among`},
		{"no source", func(d *Definition) { d.Transitions[1].From = nil }, "no source"},
		{"self-loop", func(d *Definition) {
			d.Transitions = append(d.Transitions, Transition{Name: "remind", From: []State{"WAIT_PAY"}, To: "WAIT_PAY"})
		}, `self-loop on "WAIT_PAY"`},
		{"edge twice in two transitions", func(d *Definition) {
			d.Transitions = append(d.Transitions, Transition{Name: "abort", From: []State{"NEW"}, To: "CANCELLED"})
		}, `edge NEW → CANCELLED is already declared by "cancel"`},
		{"edge twice in one transition", func(d *Definition) { d.Transitions[3].From = []State{"NEW", "NEW"} }, "already declared"},
		{"edge out of a final state", func(d *Definition) {
			d.Transitions = append(d.Transitions, Transition{Name: "reopen", From: []State{"CANCELLED"}, To: "NEW"})
		}, `leaves the final state "CANCELLED"`},
		{"unreachable", func(d *Definition) {
			d.States = append(d.States, "LEGACY")
			d.Transitions = append(d.Transitions, Transition{Name: "legacy", From: []State{"LEGACY"}, To: "CANCELLED"})
		}, `"LEGACY" cannot be reached`},
		{"dead end not final", func(d *Definition) { d.Final = []State{"CANCELLED"} }, `"SHIPPED" has no transition out and is not final`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := orderDef()
			tc.change(d)
			m, err := New(d)
			if err == nil {
				t.Fatalf("New accepted it: %v", m.Mermaid())
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "fsm: ") {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestMachine(t *testing.T) {
	t.Parallel()
	d := orderDef()
	m, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	// New copied the definition.
	d.Transitions[3].From[0] = "PAID"
	d.States[0] = "CHANGED"
	if !m.Can("NEW", "CANCELLED") || m.Can("PAID", "CANCELLED") || !m.Has("NEW") || m.Has("CHANGED") {
		t.Error("the machine changed with the definition it was given")
	}
	if got := m.Sources("CANCELLED"); len(got) != 2 || got[0] != "NEW" || got[1] != "WAIT_PAY" {
		t.Errorf("Sources(CANCELLED) = %v", got)
	}
	if got := m.Sources("NEW"); len(got) != 0 {
		t.Errorf("Sources(NEW) = %v", got)
	}
	if !m.IsFinal("SHIPPED") || m.IsFinal("PAID") || m.Initial() != "NEW" || len(m.States()) != 5 {
		t.Error("IsFinal, Initial or States disagree with the definition")
	}
	tr, ok := m.Lookup("cancel")
	if !ok || tr.To != "CANCELLED" || len(tr.From) != 2 {
		t.Errorf("Lookup(cancel) = %+v, %v", tr, ok)
	}
	tr.From[0] = "PAID"
	if m.Can("PAID", "CANCELLED") {
		t.Error("Lookup's result shares memory with the machine")
	}
	if _, ok := m.Lookup("refund"); ok {
		t.Error("Lookup(refund) found a transition")
	}
}

func TestMermaid(t *testing.T) {
	t.Parallel()
	m := MustNew(orderDef())
	const want = `stateDiagram-v2
    [*] --> NEW
    NEW --> WAIT_PAY: submit
    WAIT_PAY --> PAID: pay
    PAID --> SHIPPED: ship
    NEW --> CANCELLED: cancel
    WAIT_PAY --> CANCELLED: cancel
    SHIPPED --> [*]
    CANCELLED --> [*]
`
	if got := m.Mermaid(); got != want {
		t.Errorf("Mermaid() =\n%s\nwant\n%s", got, want)
	}

	// States that are not identifiers, or are Mermaid's words, get aliases.
	odd := MustNew(&Definition{
		States:  []State{"new", `on "hold"`, "end"},
		Initial: "new",
		Final:   []State{"end"},
		Transitions: []Transition{
			{Name: "hold", From: []State{"new"}, To: `on "hold"`},
			{Name: "finish", From: []State{"new", `on "hold"`}, To: "end"},
		},
	})
	const wantOdd = `stateDiagram-v2
    state "on #quot;hold#quot;" as s1
    state "end" as s2
    [*] --> new
    new --> s1: hold
    new --> s2: finish
    s1 --> s2: finish
    s2 --> [*]
`
	if got := odd.Mermaid(); got != wantOdd {
		t.Errorf("Mermaid() =\n%s\nwant\n%s", got, wantOdd)
	}
}

// An alias never takes the id of another state: "a b" (the first state)
// is drawn as s0, which a state may be named; and a label holding what
// Mermaid reads as an entity code shows as it is.
func TestMermaidAliasCollision(t *testing.T) {
	t.Parallel()
	m := MustNew(&Definition{
		States:  []State{"a b", "s0", "s0_", "x#quot;y"},
		Initial: "a b",
		Final:   []State{"x#quot;y"},
		Transitions: []Transition{
			{Name: "go", From: []State{"a b"}, To: "s0"},
			{Name: "on", From: []State{"s0"}, To: "s0_"},
			{Name: "end", From: []State{"s0_"}, To: "x#quot;y"},
		},
	})
	const want = `stateDiagram-v2
    state "a b" as s0__
    state "x#35;quot;y" as s3
    [*] --> s0__
    s0__ --> s0: go
    s0 --> s0_: on
    s0_ --> s3: end
    s3 --> [*]
`
	if got := m.Mermaid(); got != want {
		t.Errorf("Mermaid() =\n%s\nwant\n%s", got, want)
	}
}

func TestMustNewPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("MustNew of an empty definition did not panic")
		}
	}()
	MustNew(&Definition{})
}

func TestNewNilDefinition(t *testing.T) {
	t.Parallel()
	if _, err := New(nil); err == nil || !strings.Contains(err.Error(), "needs a Definition") {
		t.Errorf("New(nil) = %v", err)
	}
}
