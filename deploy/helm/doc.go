// Package helm holds the tests of mpsd's Helm chart, deploy/helm/mpsd: no
// code of its own. They load the chart with Helm's own loader, render it
// with its engine for Kubernetes 1.37 (as helm install and helm template
// would, without a cluster), decode every rendered object strictly into
// the k8s.io/api types (the Prometheus operator's objects into the fields
// its CRDs define), and check the default render against
// examples/kubernetes/mpsd-daemonset.yaml, the rendered configs with mpsd's
// own config loader, that releases of one name in two namespaces do not
// share a cluster-scoped object, the values the chart refuses, that a
// value holding a newline never adds a field or a flag to a manifest, and
// Helm's lint rules.
// They also keep the chart's copies of examples/prometheus's alert rules
// and examples/grafana's dashboard equal to those files.
package helm
