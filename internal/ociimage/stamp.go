package ociimage

import (
	"fmt"
	"strings"
	"time"
)

// buildinfoPkg is the package whose variables hack/ldflags.sh sets.
const buildinfoPkg = "github.com/mpsd/mpsd/internal/buildinfo"

// Stamp is what hack/ldflags.sh stamps into the programs: their version,
// commit and the commit's time.
type Stamp struct {
	Version, Commit string
	Time            time.Time
}

// ParseLdflags reads the -X settings of hack/ldflags.sh's output, so the
// image carries exactly what its programs say of themselves. Empty flags
// (no git, no VERSION file) give the zero Stamp; a commit time that is
// not RFC 3339 is an error.
func ParseLdflags(flags string) (Stamp, error) {
	var s Stamp
	f := strings.Fields(flags)
	for i := 0; i < len(f); i++ {
		if f[i] != "-X" || i+1 == len(f) {
			continue
		}
		i++
		kv, ok := strings.CutPrefix(f[i], buildinfoPkg+".")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "version":
			s.Version = v
		case "commit":
			s.Commit = v
		case "commitTime":
			if v == "" {
				continue
			}
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return Stamp{}, fmt.Errorf("ociimage: the commit time in the ldflags: %w", err)
			}
			s.Time = t.UTC()
		}
	}
	return s, nil
}
