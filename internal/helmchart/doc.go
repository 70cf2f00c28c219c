// Package helmchart packages mpsd's Helm chart (deploy/helm/mpsd) for make
// package-chart: the chart as Helm's own loader reads it, its version a
// SemVer derived from the version hack/ldflags.sh stamps into the
// programs (ChartVersion), its appVersion the tag of the image make
// package-image writes from the same stamp (ociimage.Tag), so that the
// packaged chart's default image is that image; saved with Helm's
// chartutil as <name>-<version>.tgz, every file dated the commit's time,
// so one commit gives the same bytes.
//
// It reads the chart's directory and writes one archive; it never starts
// a program and never talks to a cluster or a repository.
package helmchart
