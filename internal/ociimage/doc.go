// Package ociimage assembles mpsd's container image (make package-image):
// a layer of the minimal user space the programs need, unpacked from
// Debian packages' data archives (libc6 and what it depends on, passwd
// and group files naming root, each package's control paragraph in
// /var/lib/dpkg/status.d for scanners, their copyright files kept), a layer of the three programs at
// /usr/bin, an OCI config whose entrypoint is /usr/bin/mpsd, and an
// archive holding both an OCI image layout and a docker-archive
// manifest.json, which `ctr images import` and `docker load` take.
//
// Everything it writes is a function of its inputs: layer entries are
// sorted and owned by root, every time (file, config, history) is the
// one given (the commit's time, as SOURCE_DATE_EPOCH), device nodes and
// the packages' documentation, manual pages and locales are left out,
// and files lose their setuid and setgid bits (SetIDAllowed). So
// the same programs and packages give the same digest; make build's
// programs are the same from one commit, wherever it is checked out
// (-trimpath), with the same Go toolchain and C compiler (cgo).
//
// It reads archives and writes one; it never starts a program (the
// Debian packages are fetched and unpacked to tar streams by
// hack/fetch-image-debs.sh) and never talks to a registry.
package ociimage
