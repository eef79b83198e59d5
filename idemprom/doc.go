// Package idemprom counts what idem's packages report to an idem.Observer
// in Prometheus metrics (github.com/prometheus/client_golang).
//
//	obs, err := idemprom.New(prometheus.DefaultRegisterer, nil)
//	mw, err := idemhttp.New(&idemhttp.Config{Store: store, StoreName: "postgres", Observer: obs})
//	http.Handle("GET /metrics", promhttp.Handler())
//
// Every label takes its values from a bounded set: a route pattern, an
// outcome, a store's name, an operation, a consumer group, a relay's name.
// A key, a scope, a message ID or a user ID is never a label (idem.Event
// carries them only hashed, in KeyHash, which this package ignores).
//
// # Metrics
//
//	name                                   type       labels                    meaning
//	idem_requests_total                    counter    route, outcome            guarded requests (idemhttp, idemgrpc) by outcome: executed, replayed,
//	                                                                            in_flight, mismatch, missing_key, invalid_key, invalid_request,
//	                                                                            unauthenticated, store_error, too_large, lease_lost, released, passed
//	idem_request_duration_seconds          histogram  route, outcome            time from a request's arrival to its answer being decided
//	idem_store_operation_duration_seconds  histogram  store, operation, result  record store calls (acquire, complete, complete_tx, extend, release,
//	                                                                            get, delete, sweep); result ok or error
//	idem_store_errors_total                counter    store, operation          store calls that failed (not found, lease lost are answers, not errors)
//	idem_lease_renewals_total              counter    result                    the watchdog's renewals: renewed, renew_failed
//	idem_leases_lost_total                 counter    -                         executions whose lease was lost (taken over, or not renewed in time)
//	idem_swept_total                       counter    store, what               rows removed by sweeps; what: records, tokens, inbox, outbox
//	idem_lock_operations_total             counter    result                    locks: acquired, contended, lost, released
//	idem_token_operations_total            counter    operation, result         submit tokens: issue/issued, consume/consumed, used, invalid
//	idem_inbox_messages_total              counter    group, result             messages an inbox handled: processed, duplicate, retried, dead, in_flight
//	idem_outbox_published_total            counter    relay                     messages an outbox relay published
//	idem_outbox_backlog                    gauge      relay                     rows pending in the outbox at the relay's last measure
//	idem_outbox_lag_seconds                gauge      relay                     how long the oldest pending row had waited then
//
// The route of idem_requests_total is the ServeMux pattern that matched
// the request ("POST /orders"), idemhttp's Config.Route, or a gRPC full
// method ("/shop.Orders/Create"): the protocol shows in its shape, so
// there is no protocol label.
//
// The replay ratio of a route over 5 minutes, say:
//
//	sum by (route) (rate(idem_requests_total{outcome="replayed"}[5m]))
//	  / sum by (route) (rate(idem_requests_total[5m]))
//
// docs/grafana/idem-dashboard.json in the repository is a Grafana
// dashboard over these metrics.
package idemprom
