package deviceplugin

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/mpsd/mpsd/api"
)

// ResourceDomain prefixes every extended resource the plugin registers:
// group g is ResourceDomain + "/" + g + "-sm".
const ResourceDomain = "mpsd.io"

// MaxUnits bounds the units of one instance: an SM budget is a percentage.
const MaxUnits = 100

// maxGPUIndex bounds a GPU index in a device ID, as api.InjectXidRequest
// does.
const maxGPUIndex = 1023

// ErrBadID is wrapped when a device ID or a job ID is not one this plugin
// makes.
var ErrBadID = errors.New("deviceplugin: bad device ID")

// ResourceName is the extended resource of a group: mpsd.io/<group>-sm,
// counted in SM-percent units.
func ResourceName(group string) string { return ResourceDomain + "/" + group + "-sm" }

// Unit is one SM-percent unit of an instance: the device the kubelet
// counts. Its ID is "<group>-gpu<index>-sm<n>", index being the instance's
// first GPU and n counting from 0 to the group's sm_percent - 1.
type Unit struct {
	Group string
	GPU   int
	N     int
}

// ID is the device ID the kubelet sees.
func (u Unit) ID() string {
	return u.Group + "-gpu" + strconv.Itoa(u.GPU) + "-sm" + strconv.Itoa(u.N)
}

// ParseUnit reads a device ID made by Unit.ID. It is strict (no sign, no
// leading zeros, a valid group name), so ParseUnit(s).ID() == s for every
// s it accepts. Errors wrap ErrBadID.
func ParseUnit(id string) (Unit, error) {
	rest, n, ok := cutNumber(id, "-sm")
	if !ok || n >= MaxUnits {
		return Unit{}, fmt.Errorf("%w %q: want <group>-gpu<index>-sm<0-%d>", ErrBadID, id, MaxUnits-1)
	}
	group, gpu, ok := cutNumber(rest, "-gpu")
	if !ok || gpu > maxGPUIndex {
		return Unit{}, fmt.Errorf("%w %q: want <group>-gpu<0-%d>-sm<n>", ErrBadID, id, maxGPUIndex)
	}
	if !validGroup(group) {
		return Unit{}, fmt.Errorf("%w %q: %q is not a group name", ErrBadID, id, group)
	}
	return Unit{Group: group, GPU: gpu, N: n}, nil
}

// cutNumber splits s at the last sep into what comes before and the
// decimal number after it (no sign, no leading zero, at most 4 digits).
func cutNumber(s, sep string) (string, int, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", 0, false
	}
	digits := s[i+len(sep):]
	if digits == "" || len(digits) > 4 || (len(digits) > 1 && digits[0] == '0') {
		return "", 0, false
	}
	n := 0
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return "", 0, false
		}
		n = 10*n + int(c-'0')
	}
	return s[:i], n, true
}

// validGroup is policy's grammar of group names: 1-32 lower-case letters,
// digits, '-' or '_', starting with a letter or digit.
func validGroup(g string) bool {
	if g == "" || len(g) > 32 {
		return false
	}
	for i, c := range []byte(g) {
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_') {
			return false
		}
	}
	return true
}

// ParseGroups reads a comma-separated list of group names (spaces around
// them allowed), as --kubelet-groups gives it; empty means every group.
func ParseGroups(list string) ([]string, error) {
	var groups []string
	for g := range strings.SplitSeq(list, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		if !validGroup(g) {
			return nil, fmt.Errorf("deviceplugin: %q is not a group name (1-32 lower-case letters, digits, '-' or '_')", g)
		}
		groups = append(groups, g)
	}
	return groups, nil
}

// parseUnits reads the device IDs of one container request: all must be
// units of group on one instance. It returns the instance's first GPU and
// the unit numbers, sorted and without repeats.
func parseUnits(group string, ids []string) (gpu int, units []int, err error) {
	if len(ids) == 0 {
		return 0, nil, fmt.Errorf("%w: no device IDs", ErrBadID)
	}
	gpu = -1
	for _, id := range ids {
		u, err := ParseUnit(id)
		if err != nil {
			return 0, nil, err
		}
		if u.Group != group {
			return 0, nil, fmt.Errorf("%w %q: not a unit of group %s", ErrBadID, id, group)
		}
		if gpu >= 0 && u.GPU != gpu {
			return 0, nil, fmt.Errorf("%w: units of GPU %d and GPU %d in one container; the units of one container must lie on one GPU (an MPS client has one SM share)", ErrBadID, gpu, u.GPU)
		}
		gpu = u.GPU
		units = append(units, u.N)
	}
	slices.Sort(units)
	return gpu, slices.Compact(units), nil
}

// jobIDPrefix marks the leases the plugin makes: their JobID is
// jobIDPrefix followed by the unit numbers, so a restarted plugin can tell
// which units each of its leases holds.
const jobIDPrefix = "k8s:sm="

// jobID names the units of a lease in mpsd's status: "k8s:sm=0-29,40", or,
// when ranges would not fit api.MaxJobIDLen, "k8s:sm=x" and a bitmap in
// hex (bit n of byte n/8 for unit n).
func jobID(units []int) string {
	var b strings.Builder
	b.WriteString(jobIDPrefix)
	for i := 0; i < len(units); {
		j := i
		for j+1 < len(units) && units[j+1] == units[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(units[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(units[j]))
		}
		i = j + 1
	}
	if b.Len() <= api.MaxJobIDLen {
		return b.String()
	}
	bits := make([]byte, (MaxUnits+7)/8)
	last := 0
	for _, u := range units {
		bits[u/8] |= 1 << (u % 8)
		last = u / 8
	}
	return jobIDPrefix + "x" + hex.EncodeToString(bits[:last+1])
}

// parseJobID reads the units of a jobID; ok is false for a job id the
// plugin did not make (another client's lease) or a malformed one.
func parseJobID(s string) (units []int, ok bool) {
	rest, found := strings.CutPrefix(s, jobIDPrefix)
	if !found || rest == "" {
		return nil, false
	}
	if hx, isBits := strings.CutPrefix(rest, "x"); isBits {
		bits, err := hex.DecodeString(hx)
		if err != nil || len(bits) == 0 || len(bits) > (MaxUnits+7)/8 {
			return nil, false
		}
		for n := range len(bits) * 8 {
			if bits[n/8]&(1<<(n%8)) != 0 {
				if n >= MaxUnits {
					return nil, false
				}
				units = append(units, n)
			}
		}
		return units, len(units) > 0
	}
	for part := range strings.SplitSeq(rest, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, ok1 := smallNumber(lo)
		b := a
		ok2 := true
		if isRange {
			b, ok2 = smallNumber(hi)
		}
		if !ok1 || !ok2 || b < a || b >= MaxUnits || len(units) > 0 && a <= units[len(units)-1] {
			return nil, false
		}
		for n := a; n <= b; n++ {
			units = append(units, n)
		}
	}
	return units, true
}

func smallNumber(s string) (int, bool) {
	_, n, ok := cutNumber("-"+s, "-")
	return n, ok
}

// overlaps reports whether two sorted unit lists share a unit.
func overlaps(a, b []int) bool {
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			return true
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return false
}
