// Package promtest finds the Prometheus programs that tests run against the
// shipped monitoring files: promtool and prometheus from Debian's prometheus
// package, which hack/fetch-prometheus.sh extracts (without installing it)
// into ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/prometheus, or
// $MPSD_PROMETHEUS_CACHE. A test that needs one is skipped, with the reason,
// when it is missing, unless MPSD_REQUIRE_PROMETHEUS=1 (CI sets it) makes
// that a failure.
//
// Its own tests check examples/prometheus (promtool check and test rules,
// the example scrape config), examples/grafana/mpsd.json and docs/alerts.md
// against the metric names mpsd exports (docs/architecture.md#metrics-and-systemd). It is imported only
// by tests; it runs nothing itself (os/exec stays in its _test.go files).
package promtest
