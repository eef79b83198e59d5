package dbosbench

import (
	"context"
	"strconv"
	"testing"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/idemkit/idem/internal/benchpair"
)

// The benchmarks insert one row into bench_effects per step, on a
// database of their own at IDEM_POSTGRES_URL:
//
//   - raw: BEGIN, INSERT, COMMIT over database/sql (pgx's stdlib driver),
//     the floor: no checkpoint at all;
//   - raw_pgx: the same over pgxpool, the driver DBOS runs on;
//   - dbos_step: the insert as a DBOS step (dbos.RunAsStep) whose body
//     runs raw_pgx's transaction; DBOS checkpoints the step afterwards
//     in a transaction of its own;
//   - dbos_tx: the insert as a DBOS transaction (dbos.RunAsTransaction)
//     on a data source over the system database's pool: the insert and
//     the checkpoint commit together;
//   - dbos_tx2: the same on a data source over another pool, which DBOS
//     treats as another database: the insert commits with a
//     transaction_completion row, then the checkpoint commits in the
//     system database;
//   - idem_step: a local step of idem's steps (not wired yet).
//
// Each DBOS kind runs as a workflow of 1 step (wf1: a whole workflow,
// start and end included) and of 10 steps (wf10). The marginal cost of a
// step is (wf10 − wf1)/9: the workflow's own cost cancels out.
// BenchmarkStepPaired reports it; BenchmarkStep reports wf10's ns/step,
// which still carries a tenth of the workflow's cost, and runs a workflow
// of b.N steps (wfN), whose ns/op is one step.
//
//	GOWORK=off go test -run '^$' -bench . -benchmem -count 5

// steps is the number of steps of the longer workflows.
const steps = 10

// BenchmarkStep runs each variant as a sub-benchmark, so that -count
// interleaves them across rounds. An op is one unit: a raw transaction, a
// whole workflow, or one idem step. "ns/step" divides an op by its steps;
// "stmts/step" counts the statements sent to PostgreSQL (each one round
// trip; BEGIN and COMMIT included), with DBOS's background polling, a few
// statements a second, in the DBOS variants' counts.
func BenchmarkStep(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	perStep := func(b *testing.B, n int, f func(i int)) {
		start := e.stmts.n.Load()
		i := 0
		for b.Loop() {
			f(i)
			i++
		}
		stmts := e.stmts.n.Load() - start
		b.ReportMetric(float64(stmts)/float64(b.N*n), "stmts/step")
		if n > 1 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/step")
		}
	}
	b.Run("raw", func(b *testing.B) {
		perStep(b, 1, func(i int) {
			if err := e.insertSQLTx(ctx, "raw", i); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("raw_pgx", func(b *testing.B) {
		perStep(b, 1, func(i int) {
			if err := insertPgxTx(ctx, e.pool, "raw_pgx", i); err != nil {
				b.Fatal(err)
			}
		})
	})
	for _, k := range e.dbosKinds() {
		for _, n := range []int{1, steps} {
			b.Run(k.name+"/wf"+strconv.Itoa(n), func(b *testing.B) {
				perStep(b, n, func(int) { e.run(b, k.wf, n) })
			})
		}
		// One workflow of b.N steps: an op is one step, with 1/b.N of
		// the workflow's start and end.
		b.Run(k.name+"/wfN", func(b *testing.B) {
			start := e.stmts.n.Load()
			e.run(b, k.wf, b.N)
			b.ReportMetric(float64(e.stmts.n.Load()-start)/float64(b.N), "stmts/step")
		})
	}
	b.Run("idem_step", func(b *testing.B) {
		e.idemStep(b)
	})
}

// idemStep will measure one local step of an idem steps operation: in one
// transaction, the check of the idempotency record's owner and fence, the
// insert and the step's checkpoint row, committed together (the record
// acquired beforehand, outside the timing, as BenchmarkComplete in
// sqlstore leases in batches). Like dbos_tx it then needs a wf1/wf10
// pair if an operation has a cost of its own (Acquire, Complete) beyond
// its steps.
func (e *env) idemStep(b *testing.B) {
	e.idemStore(b) // the records table is ready for it
	b.Skip("idem steps not wired yet")
}

// BenchmarkStepPaired runs every variant once per iteration, in a rotating
// order (internal/benchpair), so that all means are taken over the same
// stretch of time; it reports each mean as "<name>-ns", the marginal
// step of each DBOS kind, (wf10 − wf1)/9, as "<kind>/step-ns", and every
// mean's ratio to raw as "<name>-x-raw". Its own ns/op is a whole
// iteration (all variants together): ignore it.
//
//	GOWORK=off go test -run '^$' -bench StepPaired -benchtime 300x -count 3
func BenchmarkStepPaired(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	i := 0
	fns := []benchpair.Func{
		{Name: "raw", F: func() {
			i++
			if err := e.insertSQLTx(ctx, "raw", i); err != nil {
				b.Fatal(err)
			}
		}},
		{Name: "raw_pgx", F: func() {
			i++
			if err := insertPgxTx(ctx, e.pool, "raw_pgx", i); err != nil {
				b.Fatal(err)
			}
		}},
	}
	kinds := e.dbosKinds()
	for _, k := range kinds {
		for _, n := range []int{1, steps} {
			fns = append(fns, benchpair.Func{Name: k.name + "/wf" + strconv.Itoa(n), F: func() { e.run(b, k.wf, n) }})
		}
	}
	// idem: append {Name: "idem_step", F: …} here once the steps API
	// lands (see idemStep); the DBOS means above keep their indexes.
	m := benchpair.Run(b, fns...)
	raw := m[0]
	for j, f := range fns {
		benchpair.Ratio(b, f.Name+"-x-raw", m[j], raw)
	}
	for j, k := range kinds {
		wf1, wf10 := m[2+2*j], m[3+2*j]
		step := (wf10 - wf1) / (steps - 1)
		b.ReportMetric(step, k.name+"/step-ns")
		benchpair.Ratio(b, k.name+"/step-x-raw", step, raw)
	}
}

// dbosKind is one way of running the insert under DBOS.
type dbosKind struct {
	name string
	wf   dbos.Workflow[int, int]
}

func (e *env) dbosKinds() []dbosKind {
	return []dbosKind{
		{"dbos_step", e.stepWorkflow},
		{"dbos_tx", e.txWorkflow},
		{"dbos_tx2", e.tx2Workflow},
	}
}
