package ociimage

// Repository is the image's name: `ctr images import` and containerd's
// CRI know it as docker.io/library/mpsd.
const Repository = "mpsd"

// maxTag is the longest tag the distribution spec allows.
const maxTag = 128

// Tag turns version (what hack/ldflags.sh stamps, git describe's output
// such as v1.2.0-3-g0123abc-dirty, or a release's 1.2.0+deb1) into a
// valid image tag, [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}: every other
// character becomes "-", a first "." or "-" becomes "_", and it is cut at
// 128 characters. An empty version gives "latest".
func Tag(version string) string {
	if version == "" {
		return "latest"
	}
	b := []byte(version)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
		case c == '.' || c == '-':
			if i == 0 {
				b[i] = '_'
			}
		default:
			b[i] = '-'
		}
	}
	if len(b) > maxTag {
		b = b[:maxTag]
	}
	return string(b)
}

// Ref is the image's short reference, mpsd:<Tag(version)>, as a DaemonSet
// names it.
func Ref(version string) string { return Repository + ":" + Tag(version) }

// FullName is the reference containerd stores for Ref(version):
// docker.io/library/mpsd:<tag>.
func FullName(version string) string {
	return "docker.io/library/" + Ref(version)
}
