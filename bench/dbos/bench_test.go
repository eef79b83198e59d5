package dbosbench

import (
	"context"
	"strconv"
	"testing"

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
//   - idem_step: the insert as a local step of idem's steps
//     (steps.Local over sqlstore.StepJournal): the insert, the check of
//     the record's owner and fence and the checkpoint commit together.
//     An operation (Op.Call) acquires its record, begins in the journal,
//     runs its steps, and completes the record and ends the operation in
//     one transaction.
//
// Each kind runs as a workflow (an operation) of 1 step (wf1: a whole
// workflow, start and end included) and of 10 steps (wf10). The
// marginal cost of a step is (wf10 − wf1)/9: the workflow's own cost
// cancels out.
// BenchmarkStepPaired reports it; BenchmarkStep reports wf10's ns/step,
// which still carries a tenth of the workflow's cost, and runs a workflow
// of b.N steps (wfN), whose ns/op is one step.
//
//	GOWORK=off go test -run '^$' -bench . -benchmem -count 5

// nSteps is the number of steps of the longer workflows.
const nSteps = 10

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
	for _, k := range e.kinds() {
		for _, n := range []int{1, nSteps} {
			b.Run(k.name+"/wf"+strconv.Itoa(n), func(b *testing.B) {
				perStep(b, n, func(int) { k.run(b, n) })
			})
		}
		// One workflow of b.N steps: an op is one step, with 1/b.N of
		// the workflow's start and end.
		b.Run(k.name+"/wfN", func(b *testing.B) {
			start := e.stmts.n.Load()
			k.run(b, b.N)
			b.ReportMetric(float64(e.stmts.n.Load()-start)/float64(b.N), "stmts/step")
		})
	}
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
	kinds := e.kinds()
	for _, k := range kinds {
		for _, n := range []int{1, nSteps} {
			fns = append(fns, benchpair.Func{Name: k.name + "/wf" + strconv.Itoa(n), F: func() { k.run(b, n) }})
		}
	}
	m := benchpair.Run(b, fns...)
	raw := m[0]
	for j, f := range fns {
		benchpair.Ratio(b, f.Name+"-x-raw", m[j], raw)
	}
	for j, k := range kinds {
		wf1, wf10 := m[2+2*j], m[3+2*j]
		step := (wf10 - wf1) / (nSteps - 1)
		b.ReportMetric(step, k.name+"/step-ns")
		benchpair.Ratio(b, k.name+"/step-x-raw", step, raw)
	}
}

// kind is one way of running the insert as checkpointed steps: run runs
// a workflow (an operation) of n steps.
type kind struct {
	name string
	run  func(tb testing.TB, n int)
}

// kinds are DBOS's three and idem's.
func (e *env) kinds() []kind {
	return []kind{
		{"dbos_step", func(tb testing.TB, n int) { e.run(tb, e.stepWorkflow, n) }},
		{"dbos_tx", func(tb testing.TB, n int) { e.run(tb, e.txWorkflow, n) }},
		{"dbos_tx2", func(tb testing.TB, n int) { e.run(tb, e.tx2Workflow, n) }},
		{"idem_step", e.idem},
	}
}
