package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// ErrName is returned for an entry whose name has a ".." element.
var ErrName = errors.New("ociimage: entry name leaves the image's root")

// ErrConflict is returned when two inputs put different things at one
// path of a layer.
var ErrConflict = errors.New("ociimage: conflicting layer entries")

// ErrSetID is returned for a regular file with its setuid or setgid bit
// set that SetIDAllowed does not name.
var ErrSetID = errors.New("ociimage: a set-id file the image does not allow")

// SetIDAllowed are the files of the image that may keep a setuid or
// setgid bit: none. mpsd runs as root and starts no program that must
// change its ids; a set-id program from a package would only be a way
// for an unprivileged process in the container to become another user.
var SetIDAllowed = map[string]bool{}

// setID is the setuid and setgid bits.
const setID = 0o6000

// Entry is one file, directory or link of a layer.
type Entry struct {
	// Name is the path in the image, relative and clean: usr/bin/mpsd.
	Name string
	// Type is tar.TypeReg, tar.TypeDir or tar.TypeSymlink.
	Type byte
	// Mode is the permission bits, setuid, setgid and sticky included.
	Mode int64
	// Linkname is a link's target.
	Linkname string
	// Body is a regular file's content.
	Body []byte
}

// same reports whether e and o describe the same thing.
func (e Entry) same(o Entry) bool {
	return e.Type == o.Type && e.Mode == o.Mode && e.Linkname == o.Linkname && bytes.Equal(e.Body, o.Body)
}

// Stripped are the directories of the Debian packages' data left out of
// the image: documentation, manual and info pages, translations, and
// lintian's overrides. Nothing in the image reads them. Each package's
// copyright file stays (usr/share/doc/<package>/copyright, or the link
// usr/share/doc/<package> to another package's directory): the
// licenses of glibc and libgcc (LGPL, GPL with its runtime exception)
// ask for it to go with the binaries.
var Stripped = []string{
	"usr/share/doc",
	"usr/share/man",
	"usr/share/info",
	"usr/share/locale",
	"usr/share/lintian",
	"usr/share/bug",
}

func stripped(name string, typ byte) bool {
	if rest, ok := strings.CutPrefix(name, "usr/share/doc/"); ok {
		pkg, file, _ := strings.Cut(rest, "/")
		switch {
		case pkg != "" && file == "copyright" && (typ == tar.TypeReg || typ == tar.TypeLink || typ == tar.TypeSymlink):
			return false
		case pkg != "" && file == "" && typ == tar.TypeSymlink:
			return false
		}
	}
	for _, s := range Stripped {
		if name == s || strings.HasPrefix(name, s+"/") {
			return true
		}
	}
	return false
}

// cleanName is a tar entry's name as an Entry's Name: without "./", a
// leading "/" or a trailing "/"; "" for the archive's root. A name with a
// ".." element is refused (ErrName): no entry may point out of the root.
func cleanName(name string) (string, error) {
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", fmt.Errorf("%w: %q", ErrName, name)
	}
	return strings.TrimPrefix(path.Clean("/"+name), "/"), nil
}

// ReadTar reads the entries of a package's data archive (what
// `dpkg-deb --fsys-tarfile` writes) for a layer: directories, regular
// files and symbolic links with their permission bits; hard links become
// copies of the file they name (so leaving out that file cannot break
// them); device nodes, FIFOs and whatever Stripped names (but the
// copyright files) are left out.
// Owners and times are not kept: a layer's are root's and the build's.
// A regular file loses its setuid and setgid bits unless SetIDAllowed
// names it.
func ReadTar(r io.Reader) ([]Entry, error) {
	tr := tar.NewReader(r)
	var out []Entry
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ociimage: read a package's data: %w", err)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return nil, err
		}
		if name == "" {
			continue
		}
		if stripped(name, h.Typeflag) {
			if h.Typeflag == tar.TypeReg { // a kept hard link may name it
				if files[name], err = io.ReadAll(tr); err != nil {
					return nil, fmt.Errorf("ociimage: read %s: %w", name, err)
				}
			}
			continue
		}
		e := Entry{Name: name, Mode: h.Mode & 0o7777}
		switch h.Typeflag {
		case tar.TypeDir:
			e.Type = tar.TypeDir
		case tar.TypeReg:
			e.Type = tar.TypeReg
			if e.Body, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("ociimage: read %s: %w", name, err)
			}
			files[name] = e.Body
		case tar.TypeSymlink:
			e.Type, e.Linkname = tar.TypeSymlink, h.Linkname
		case tar.TypeLink:
			target, err := cleanName(h.Linkname)
			if err != nil {
				return nil, err
			}
			body, ok := files[target]
			if !ok {
				return nil, fmt.Errorf("ociimage: hard link %s to %s, which comes before no regular file of the archive", name, h.Linkname)
			}
			e.Type, e.Body = tar.TypeReg, body
		default:
			continue // device nodes, FIFOs: a container's /dev is the runtime's
		}
		if e.Type == tar.TypeReg && !SetIDAllowed[name] {
			e.Mode &^= setID
		}
		out = append(out, e)
	}
}

// Layer is the uncompressed tar of entries: sorted by name (a directory
// before what it holds), the parent directories nobody listed added
// (0755), every entry owned by uid and gid 0 with mtime as its time, in
// the PAX format with no access or change times. The same entries give
// the same bytes. An entry listed twice must be the same both times
// (directories may differ in mode only if one of them was implied); else
// ErrConflict. A regular file with a setuid or setgid bit that
// SetIDAllowed does not name is refused (ErrSetID).
func Layer(entries []Entry, mtime time.Time) ([]byte, error) {
	byName := map[string]Entry{}
	for _, e := range entries {
		name, err := cleanName(e.Name)
		if err != nil {
			return nil, err
		}
		if name == "" {
			continue
		}
		e.Name = name
		if e.Type == tar.TypeReg && e.Mode&setID != 0 && !SetIDAllowed[name] {
			return nil, fmt.Errorf("%w: %s has mode %o", ErrSetID, name, e.Mode)
		}
		if old, ok := byName[name]; ok && !old.same(e) {
			return nil, fmt.Errorf("%w: %s is listed twice, differently (type %c mode %o, then type %c mode %o)", ErrConflict, name, old.Type, old.Mode, e.Type, e.Mode)
		}
		byName[name] = e
	}
	for name := range byName {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if p, ok := byName[dir]; ok {
				if p.Type != tar.TypeDir {
					return nil, fmt.Errorf("%w: %s is under %s, which is not a directory", ErrConflict, name, dir)
				}
				continue
			}
			byName[dir] = Entry{Name: dir, Type: tar.TypeDir, Mode: 0o755}
		}
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, name := range names {
		e := byName[name]
		h := &tar.Header{
			Name: name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname,
			ModTime: mtime, Format: tar.FormatPAX,
		}
		switch e.Type {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.Body))
		case tar.TypeSymlink:
		default:
			return nil, fmt.Errorf("ociimage: %s: entry type %q is not one a layer holds", name, e.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("ociimage: write %s: %w", name, err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			return nil, fmt.Errorf("ociimage: write %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: close the layer: %w", err)
	}
	return buf.Bytes(), nil
}
