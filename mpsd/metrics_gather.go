package mpsd

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// mpsd's own families, those built from the daemon's state at scrape time
// (daemonCollector, budgetCollector), bypass the registry: a scrape builds
// their families itself, every series in one allocation, and /metrics
// serves them with the registry's (the Go and process collectors, the
// other collectors and the metrics that keep their own values). What the
// registry checked at every scrape (valid names, valid UTF-8 label values,
// unique series, the exposition's order) TestOwnFamiliesConsistent checks
// over a daemon with every kind of series
// (docs/architecture.md#metrics-and-systemd).

// family is one of mpsd's own metric families: what its exposition says
// of it, and its place among them.
type family struct {
	name, help string
	typ        dto.MetricType
	// labels are the label names, in the order the series' values are
	// given to labelPairs.
	labels []string
	index  int // in ownFamilies
}

// ownFamilies are mpsd's own families, in the order they were made;
// ownFamiliesByName the same in the order of their names, the
// exposition's.
var (
	ownFamilies       []*family
	ownFamiliesByName []*family
)

func init() {
	// Every package variable, the families included, is made before init
	// runs.
	ownFamiliesByName = slices.SortedFunc(slices.Values(ownFamilies), func(a, b *family) int { return strings.Compare(a.name, b.name) })
}

func gaugeFamily(name, help string, labels []string) *family {
	return newFamily(name, help, dto.MetricType_GAUGE, labels)
}

func counterFamily(name, help string, labels []string) *family {
	return newFamily(name, help, dto.MetricType_COUNTER, labels)
}

func newFamily(name, help string, typ dto.MetricType, labels []string) *family {
	f := &family{name: name, help: help, typ: typ, labels: labels, index: len(ownFamilies)}
	ownFamilies = append(ownFamilies, f)
	return f
}

// labelPairs are the label pairs of f's series with these values (in the
// order of f.labels), sorted by name as the exposition needs.
func (f *family) labelPairs(values ...string) []*dto.LabelPair {
	pairs := make([]*dto.LabelPair, len(values))
	for i, v := range values {
		pairs[i] = labelPair(f.labels[i], v)
	}
	slices.SortFunc(pairs, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	return pairs
}

// The counter and gauges of the values most series have (a fault never
// seen, a state the instance is not in), shared by every scrape: what a
// scrape hands the encoder is only read (the protobuf encoder's size cache
// is written atomically), as the label pairs made beforehand are.
var (
	counterZero = &dto.Counter{Value: new(0.0)}
	gaugeZero   = &dto.Gauge{Value: new(0.0)}
	gaugeOne    = &dto.Gauge{Value: new(1.0)}
)

// ownScrape is one scrape's series of mpsd's own families.
type ownScrape struct {
	// series are the series in the order they were added, of families
	// of[i]; nothing points into it before families.
	series []dto.Metric
	of     []int32
	// gauges and counters hold the values other than zero (and one, for
	// a gauge), in blocks that are never grown: series point into them.
	gauges   []gaugeValue
	counters []counterValue
}

type gaugeValue struct {
	msg dto.Gauge
	v   float64
}

type counterValue struct {
	msg dto.Counter
	v   float64
}

// valueBlock is how many values a block of ownScrape holds.
const valueBlock = 64

// grow makes room for n more series.
func (s *ownScrape) grow(n int) {
	s.series = slices.Grow(s.series, n)
	s.of = slices.Grow(s.of, n)
}

// add adds f's series over labels (sorted by name, made beforehand and
// never changed) with value v.
func (s *ownScrape) add(f *family, labels []*dto.LabelPair, v float64) {
	s.series = slices.Grow(s.series, 1)[:len(s.series)+1]
	s.of = append(s.of, int32(f.index))
	m := &s.series[len(s.series)-1]
	m.Label = labels
	switch {
	case f.typ == dto.MetricType_COUNTER && v == 0:
		m.Counter = counterZero
	case f.typ == dto.MetricType_COUNTER:
		c := nextValue(&s.counters)
		c.v = v
		c.msg.Value = &c.v
		m.Counter = &c.msg
	case v == 0:
		m.Gauge = gaugeZero
	case v == 1:
		m.Gauge = gaugeOne
	default:
		g := nextValue(&s.gauges)
		g.v = v
		g.msg.Value = &g.v
		m.Gauge = &g.msg
	}
}

// nextValue is a new value of the block, which a full block replaces.
func nextValue[T any](block *[]T) *T {
	if len(*block) == cap(*block) {
		*block = make([]T, 0, valueBlock)
	}
	*block = (*block)[:len(*block)+1]
	return &(*block)[len(*block)-1]
}

// families are the scrape's families with series, in the order of their
// names, each's series in the order of their label values: the
// exposition's order, as the registry sorts its own.
func (s *ownScrape) families() []*dto.MetricFamily {
	// The series by family, each family's in the order they were added.
	start := make([]int, len(ownFamilies)+1)
	for _, f := range s.of {
		start[f+1]++
	}
	withSeries := 0
	for i := range ownFamilies {
		if start[i+1] > 0 {
			withSeries++
		}
		start[i+1] += start[i]
	}
	series := make([]*dto.Metric, len(s.series))
	next := slices.Clone(start)
	for i := range s.series {
		f := s.of[i]
		series[next[f]] = &s.series[i]
		next[f]++
	}
	mfs := make([]dto.MetricFamily, withSeries)
	out := make([]*dto.MetricFamily, 0, withSeries)
	for _, f := range ownFamiliesByName {
		ms := series[start[f.index]:start[f.index+1]]
		if len(ms) == 0 {
			continue
		}
		slices.SortFunc(ms, compareSeries)
		mf := &mfs[len(out)]
		mf.Name, mf.Help, mf.Type, mf.Metric = &f.name, &f.help, &f.typ, ms
		out = append(out, mf)
	}
	return out
}

// compareSeries orders a family's series by their label values, as the
// registry does (client_golang's internal.MetricSorter; mpsd's own series
// have no timestamps).
func compareSeries(a, b *dto.Metric) int {
	if len(a.Label) != len(b.Label) {
		return cmp.Compare(len(a.Label), len(b.Label))
	}
	for i, lp := range a.Label {
		if c := strings.Compare(lp.GetValue(), b.Label[i].GetValue()); c != 0 {
			return c
		}
	}
	return 0
}

// daemonGatherer gathers what /metrics serves: the registry's families
// and mpsd's own.
type daemonGatherer Daemon

var _ prometheus.Gatherer = (*daemonGatherer)(nil)

func (g *daemonGatherer) Gather() ([]*dto.MetricFamily, error) {
	d := (*Daemon)(g)
	fams, err := d.metrics.reg.Gather()
	var s ownScrape
	(*daemonCollector)(d).collect(&s)
	(*budgetCollector)(d).collect(&s) // metrics_budget.go
	merged, dupErr := mergeFamilies(fams, s.families())
	if dupErr != nil {
		return nil, dupErr
	}
	return merged, err
}

// mergeFamilies are a and b, each in the order of the families' names,
// merged in that order. A name in both is an error: each family comes
// from one side, the registry or mpsd's own.
func mergeFamilies(a, b []*dto.MetricFamily) ([]*dto.MetricFamily, error) {
	out := make([]*dto.MetricFamily, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		switch c := strings.Compare(a[0].GetName(), b[0].GetName()); {
		case c < 0:
			out, a = append(out, a[0]), a[1:]
		case c > 0:
			out, b = append(out, b[0]), b[1:]
		default:
			return nil, fmt.Errorf("mpsd: gather metrics: family %s both registered and mpsd's own", a[0].GetName())
		}
	}
	return append(append(out, a...), b...), nil
}

// metricsGatherer gathers every family /metrics serves.
func (d *Daemon) metricsGatherer() prometheus.Gatherer { return (*daemonGatherer)(d) }

// metricsHandler serves /metrics.
func (d *Daemon) metricsHandler() http.Handler {
	return promhttp.HandlerFor(d.metricsGatherer(), promhttp.HandlerOpts{ErrorLog: slogPromLogger{d}})
}
