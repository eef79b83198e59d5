package fsm_test

import (
	"fmt"

	"github.com/idemkit/idem/fsm"
)

// An order's life, declared once: New checks it, Mermaid draws it.
func ExampleNew() {
	orders, err := fsm.New(&fsm.Definition{
		States:  []fsm.State{"NEW", "WAIT_PAY", "PAID", "SHIPPED", "CANCELLED"},
		Initial: "NEW",
		Final:   []fsm.State{"SHIPPED", "CANCELLED"},
		Transitions: []fsm.Transition{
			{Name: "submit", From: []fsm.State{"NEW"}, To: "WAIT_PAY"},
			{Name: "pay", From: []fsm.State{"WAIT_PAY"}, To: "PAID"},
			{Name: "ship", From: []fsm.State{"PAID"}, To: "SHIPPED"},
			{Name: "cancel", From: []fsm.State{"NEW", "WAIT_PAY"}, To: "CANCELLED"},
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(orders.Can("WAIT_PAY", "CANCELLED"), orders.Can("PAID", "CANCELLED"))
	fmt.Print(orders.Mermaid())
	// Output:
	// true false
	// stateDiagram-v2
	//     [*] --> NEW
	//     NEW --> WAIT_PAY: submit
	//     WAIT_PAY --> PAID: pay
	//     PAID --> SHIPPED: ship
	//     NEW --> CANCELLED: cancel
	//     WAIT_PAY --> CANCELLED: cancel
	//     SHIPPED --> [*]
	//     CANCELLED --> [*]
}

// New refuses a declaration with an edge out of a final state.
func ExampleNew_refused() {
	_, err := fsm.New(&fsm.Definition{
		States:  []fsm.State{"OPEN", "CLOSED"},
		Initial: "OPEN",
		Final:   []fsm.State{"CLOSED"},
		Transitions: []fsm.Transition{
			{Name: "close", From: []fsm.State{"OPEN"}, To: "CLOSED"},
			{Name: "reopen", From: []fsm.State{"CLOSED"}, To: "OPEN"},
		},
	})
	fmt.Println(err)
	// Output:
	// fsm: transition "reopen" leaves the final state "CLOSED"
}
