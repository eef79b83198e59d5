package fsm

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A State is a value of the status column.
type State string

// A Transition is a named edge of a Machine: from any of From to To.
type Transition struct {
	// Name names the transition ("pay", "cancel"): unique in the
	// machine, 1 to 64 bytes of letters, digits, '_', '-' and '.'.
	Name string
	// From are the states the transition leaves; at least one.
	From []State
	// To is the state it enters.
	To State
}

// A Definition declares a Machine.
type Definition struct {
	// States are every state of the machine: 1 to 255 bytes of UTF-8
	// without control characters, each once.
	States []State
	// Initial is the state rows are created in. Required.
	Initial State
	// Final are the states no transition leaves. Optional.
	Final []State
	// Transitions are the machine's edges.
	Transitions []Transition
}

// A Machine is a validated Definition: which transitions are legal. It is
// immutable and safe for concurrent use.
type Machine struct {
	def     Definition
	states  map[State]bool
	final   map[State]bool
	byName  map[string]*Transition
	sources map[State][]State // for each target, its legal sources in declaration order
}

// New validates def and returns its Machine. It refuses, with an error
// that names the culprit:
//
//   - no states, an empty or malformed state, a state listed twice;
//   - no initial state, or one that is not among States;
//   - a final state that is not among States, or listed twice;
//   - a transition without a name, with a malformed name or one used
//     twice, without sources, or naming a state not among States;
//   - a self-loop (a transition from a state to itself): the conditional
//     UPDATE of Table.Transition would succeed again on every retry, so a
//     repeated call could never be told from a new one (AlreadyApplied);
//   - the same edge (from → to) declared twice, in one transition or two;
//   - an edge out of a final state;
//   - a state that cannot be reached from the initial state: it is a typo
//     or dead code, and Transition would never lead there;
//   - a state that is not final and that no transition leaves: rows would
//     be stuck there; declare it final.
//
// def is required (a nil one is refused) and copied: changing it
// afterwards does not change the Machine.
func New(def *Definition) (*Machine, error) {
	if def == nil {
		return nil, errors.New("fsm: New needs a Definition")
	}
	m := &Machine{
		states:  map[State]bool{},
		final:   map[State]bool{},
		byName:  map[string]*Transition{},
		sources: map[State][]State{},
	}
	if len(def.States) == 0 {
		return nil, errors.New("fsm: the definition has no states")
	}
	for _, s := range def.States {
		if err := checkState(s); err != nil {
			return nil, err
		}
		if m.states[s] {
			return nil, fmt.Errorf("fsm: state %q is listed twice", s)
		}
		m.states[s] = true
	}
	if def.Initial == "" {
		return nil, errors.New("fsm: the definition has no initial state")
	}
	if !m.states[def.Initial] {
		return nil, fmt.Errorf("fsm: initial state %q is not among the states", def.Initial)
	}
	for _, s := range def.Final {
		if !m.states[s] {
			return nil, fmt.Errorf("fsm: final state %q is not among the states", s)
		}
		if m.final[s] {
			return nil, fmt.Errorf("fsm: final state %q is listed twice", s)
		}
		m.final[s] = true
	}

	// Copy the transitions, so that the caller's slices stay theirs.
	m.def = Definition{
		States:      slices.Clone(def.States),
		Initial:     def.Initial,
		Final:       slices.Clone(def.Final),
		Transitions: make([]Transition, len(def.Transitions)),
	}
	type edge struct{ from, to State }
	edges := map[edge]string{}
	out := map[State]bool{}
	for i, tr := range def.Transitions {
		tr.From = slices.Clone(tr.From)
		m.def.Transitions[i] = tr
		if err := checkName(tr.Name); err != nil {
			return nil, err
		}
		if m.byName[tr.Name] != nil {
			return nil, fmt.Errorf("fsm: transition %q is declared twice", tr.Name)
		}
		m.byName[tr.Name] = &m.def.Transitions[i]
		if !m.states[tr.To] {
			return nil, fmt.Errorf("fsm: transition %q: target %q is not among the states", tr.Name, tr.To)
		}
		if len(tr.From) == 0 {
			return nil, fmt.Errorf("fsm: transition %q has no source state", tr.Name)
		}
		for _, from := range tr.From {
			switch {
			case !m.states[from]:
				return nil, fmt.Errorf("fsm: transition %q: source %q is not among the states", tr.Name, from)
			case from == tr.To:
				return nil, fmt.Errorf("fsm: transition %q: self-loop on %q (a transition must change the state)", tr.Name, from)
			case m.final[from]:
				return nil, fmt.Errorf("fsm: transition %q leaves the final state %q", tr.Name, from)
			}
			if other, dup := edges[edge{from, tr.To}]; dup {
				return nil, fmt.Errorf("fsm: transition %q: edge %s → %s is already declared by %q", tr.Name, from, tr.To, other)
			}
			edges[edge{from, tr.To}] = tr.Name
			out[from] = true
			m.sources[tr.To] = append(m.sources[tr.To], from)
		}
	}

	// Every state is reachable from the initial one.
	reached := map[State]bool{def.Initial: true}
	queue := []State{def.Initial}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, tr := range m.def.Transitions {
			if !reached[tr.To] && slices.Contains(tr.From, s) {
				reached[tr.To] = true
				queue = append(queue, tr.To)
			}
		}
	}
	for _, s := range m.def.States {
		if !reached[s] {
			return nil, fmt.Errorf("fsm: state %q cannot be reached from the initial state %q", s, def.Initial)
		}
		if !m.final[s] && !out[s] {
			return nil, fmt.Errorf("fsm: state %q has no transition out and is not final", s)
		}
	}
	return m, nil
}

// MustNew is New for definitions fixed in the program: it panics on an
// error.
func MustNew(def *Definition) *Machine {
	m, err := New(def)
	if err != nil {
		panic(err)
	}
	return m
}

// checkState refuses an empty state, one over 255 bytes, one that is not
// UTF-8 or holds a control character.
func checkState(s State) error {
	switch {
	case s == "":
		return errors.New("fsm: empty state")
	case len(s) > 255:
		return fmt.Errorf("fsm: state %.20q… is longer than 255 bytes", s)
	case !utf8.ValidString(string(s)):
		return fmt.Errorf("fsm: state %q is not UTF-8", s)
	case strings.ContainsFunc(string(s), isControl):
		return fmt.Errorf("fsm: state %q holds a control character", s)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// checkName refuses a transition name that is empty, longer than 64 bytes
// or holds anything but letters, digits, '_', '-' and '.'.
func checkName(name string) error {
	if name == "" {
		return errors.New("fsm: a transition has no name")
	}
	if len(name) > 64 {
		return fmt.Errorf("fsm: transition name %.20q… is longer than 64 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isIdentByte(c) && c != '-' && c != '.' {
			return fmt.Errorf("fsm: transition name %q: only letters, digits, '_', '-' and '.' are allowed", name)
		}
	}
	return nil
}

func isIdentByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// Initial returns the initial state.
func (m *Machine) Initial() State { return m.def.Initial }

// States returns every state, in declaration order.
func (m *Machine) States() []State { return slices.Clone(m.def.States) }

// IsFinal reports whether s is a final state.
func (m *Machine) IsFinal(s State) bool { return m.final[s] }

// Has reports whether s is a state of the machine.
func (m *Machine) Has(s State) bool { return m.states[s] }

// Sources returns the states from which a transition leads to to, in
// declaration order; none for the initial state with no edge into it, or
// an unknown state.
func (m *Machine) Sources(to State) []State { return slices.Clone(m.sources[to]) }

// Can reports whether a transition leads from from to to.
func (m *Machine) Can(from, to State) bool { return slices.Contains(m.sources[to], from) }

// Lookup returns the transition named name.
func (m *Machine) Lookup(name string) (Transition, bool) {
	tr, ok := m.byName[name]
	if !ok {
		return Transition{}, false
	}
	return Transition{Name: tr.Name, From: slices.Clone(tr.From), To: tr.To}, true
}

// Mermaid renders the machine as a Mermaid state diagram
// (stateDiagram-v2): the initial state from [*], each transition's edges
// in declaration order labelled with its name, and each final state to
// [*]. A state whose name is not made of letters, digits and '_' is drawn
// under an alias (s0, s1 … by its position in States, with '_' appended
// while another state has that name) with its name as the label.
func (m *Machine) Mermaid() string {
	ids := make(map[State]string, len(m.def.States))
	taken := map[string]bool{}
	for _, s := range m.def.States {
		if isIdent(string(s)) && !mermaidKeywords[strings.ToLower(string(s))] {
			ids[s] = string(s)
			taken[string(s)] = true
		}
	}
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	for i, s := range m.def.States {
		if ids[s] != "" {
			continue
		}
		// A state may be named s1 itself: the alias must not be its id.
		id := "s" + strconv.Itoa(i)
		for taken[id] {
			id += "_"
		}
		ids[s], taken[id] = id, true
		fmt.Fprintf(&b, "    state \"%s\" as %s\n", mermaidLabel.Replace(string(s)), id)
	}
	fmt.Fprintf(&b, "    [*] --> %s\n", ids[m.def.Initial])
	for _, tr := range m.def.Transitions {
		for _, from := range tr.From {
			fmt.Fprintf(&b, "    %s --> %s: %s\n", ids[from], ids[tr.To], tr.Name)
		}
	}
	for _, s := range m.def.Final {
		fmt.Fprintf(&b, "    %s --> [*]\n", ids[s])
	}
	return b.String()
}

// mermaidLabel escapes a label: Mermaid reads "#name;" and "#123;" as
// entity codes, so '#' is written as one, and so is '"'.
var mermaidLabel = strings.NewReplacer("#", "#35;", `"`, "#quot;")

// isIdent reports whether s is a non-empty run of letters, digits and '_'.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return false
		}
	}
	return true
}

// mermaidKeywords are words that Mermaid's state diagrams would not read
// as a state's id.
var mermaidKeywords = map[string]bool{
	"state": true, "note": true, "end": true, "direction": true, "class": true,
	"classdef": true, "click": true, "style": true, "as": true,
}
