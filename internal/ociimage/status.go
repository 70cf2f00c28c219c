package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// StatusDir is where the image lists its Debian packages, one file of
// each package's control paragraph named by the package, as distroless
// images do: the image has no dpkg database, and scanners (Trivy, Grype,
// Syft) find the packages and their versions there.
const StatusDir = "var/lib/dpkg/status.d"

// ErrControl: the text is not a package's control paragraph.
var ErrControl = errors.New("ociimage: not a Debian package's control paragraph")

// pkgNameRe is what Debian allows a package's name to be.
var pkgNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// StatusEntry is the file of StatusDir for a package's control paragraph
// (its DEBIAN/control, as `dpkg-deb -f pkg.deb` prints it): named by its
// Package field, with "Status: install ok installed" after that field
// where the paragraph has no Status, as dpkg's status file would hold
// it. A paragraph without Package, Version or Architecture, with a line
// that is neither a field nor a continuation, with a second paragraph,
// or with a name Debian does not allow is an ErrControl.
func StatusEntry(control []byte) (Entry, error) {
	text := strings.TrimRight(string(control), "\n")
	fields := map[string]string{}
	var out bytes.Buffer
	for i, line := range strings.Split(text, "\n") {
		if line == "" {
			return Entry{}, fmt.Errorf("%w: more than one paragraph", ErrControl)
		}
		if line[0] == ' ' || line[0] == '\t' {
			if i == 0 {
				return Entry{}, fmt.Errorf("%w: a continuation line comes first", ErrControl)
			}
			out.WriteString(line + "\n")
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return Entry{}, fmt.Errorf("%w: line %d is not a field: %q", ErrControl, i+1, line)
		}
		if _, dup := fields[k]; dup {
			return Entry{}, fmt.Errorf("%w: field %s twice", ErrControl, k)
		}
		fields[k] = strings.TrimSpace(v)
		out.WriteString(line + "\n")
		if k == "Package" && !strings.Contains("\n"+text, "\nStatus:") {
			out.WriteString("Status: install ok installed\n")
		}
	}
	for _, k := range []string{"Package", "Version", "Architecture"} {
		if fields[k] == "" {
			return Entry{}, fmt.Errorf("%w: no %s", ErrControl, k)
		}
	}
	if !pkgNameRe.MatchString(fields["Package"]) {
		return Entry{}, fmt.Errorf("%w: package name %q", ErrControl, fields["Package"])
	}
	return Entry{Name: StatusDir + "/" + fields["Package"], Type: tar.TypeReg, Mode: 0o644, Body: out.Bytes()}, nil
}
