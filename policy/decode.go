package policy

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/mpsd/mpsd/internal/units"
)

// MaxConfigBytes bounds what Parse reads, so a config path pointing at a
// device or a runaway file cannot exhaust memory.
const MaxConfigBytes = 1 << 20

// keyDelim is viper's key separator. Nothing in a config contains it, so
// viper never splits a key the file wrote (a group called "a.b" stays one
// key and is reported as a bad name rather than read as nested mappings).
const keyDelim = "\x1f"

// schema indexes a field table for decoding.
type schema[T any] struct {
	fields   []field[T]
	index    map[string]int  // leaf key -> fields index
	sections map[string]bool // every proper prefix of a leaf key
}

func newSchema[T any](fields []field[T]) *schema[T] {
	s := &schema[T]{fields: fields, index: map[string]int{}, sections: map[string]bool{}}
	for i, f := range fields {
		s.index[f.key] = i
		for j := strings.LastIndexByte(f.key, '.'); j > 0; j = strings.LastIndexByte(f.key[:j], '.') {
			s.sections[f.key[:j]] = true
		}
	}
	return s
}

var (
	configSchema = newSchema(configFields)
	groupSchema  = newSchema(groupFields)
)

// decoder collects every problem of one config while decoding and
// validating it.
type decoder struct {
	problems []Problem
	// bad holds keys whose value could not be decoded or is missing, so
	// validation says nothing more about them (nor about what depends on
	// them) instead of stacking a second, confusing problem on the first.
	bad map[string]bool
	// present holds the leaf keys the file gave.
	present map[string]bool
}

func newDecoder() *decoder {
	return &decoder{bad: map[string]bool{}, present: map[string]bool{}}
}

func (d *decoder) problem(key, format string, args ...any) {
	d.problems = append(d.problems, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
}

// fail reports a key whose value is unusable.
func (d *decoder) fail(key, format string, args ...any) {
	d.bad[key] = true
	d.problem(key, format, args...)
}

// ok says whether all keys and the mappings holding them decoded, so a
// check on them is meaningful.
func (d *decoder) ok(keys ...string) bool {
	for _, k := range keys {
		for ; k != ""; k = sectionOf(k) {
			if d.bad[k] {
				return false
			}
		}
	}
	return true
}

// check reports a problem at key when cond is false, unless key did not
// decode. Checks involving other keys test d.ok on them first.
func (d *decoder) check(key string, cond bool, format string, args ...any) {
	if cond || !d.ok(key) {
		return
	}
	d.problem(key, format, args...)
}

// err returns the collected problems as a *ConfigError, or nil.
func (d *decoder) err() error {
	if len(d.problems) == 0 {
		return nil
	}
	ps := slices.Clone(d.problems)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Key < ps[j].Key })
	return &ConfigError{Problems: ps}
}

// readYAML reads data through a fresh viper and returns the top-level
// mapping. It reports false when the file cannot be read at all.
func (d *decoder) readYAML(data []byte) (map[string]any, bool) {
	if len(data) > MaxConfigBytes {
		d.problem("", "file is larger than %d bytes", MaxConfigBytes)
		return nil, false
	}
	if line := secondDocument(data); line > 0 {
		d.problem("", "line %d: a second YAML document; a config is one document", line)
		return nil, false
	}
	// Parsed once: the same tree is checked for keys that differ only in
	// case and is what viper reads (as its own ReadConfig would decode
	// it).
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.problem("", "%v", err)
		return nil, false
	}
	if ps := caseCollisions(&doc); len(ps) > 0 {
		d.problems = append(d.problems, ps...)
		return nil, false
	}
	top := map[string]any{}
	if doc.Kind != 0 {
		if err := doc.Decode(&top); err != nil {
			d.problem("", "%v", err)
			return nil, false
		}
	}
	if top == nil { // a document of null
		top = map[string]any{}
	}
	v := viper.NewWithOptions(viper.KeyDelimiter(keyDelim))
	if err := v.MergeConfigMap(top); err != nil {
		d.problem("", "%v", err)
		return nil, false
	}
	raw := map[string]any{}
	for _, k := range v.AllKeys() {
		top, _, _ := strings.Cut(k, keyDelim)
		if _, seen := raw[top]; !seen {
			raw[top] = v.Get(top)
		}
	}
	return raw, true
}

// secondDocument returns the 1-based line of a document marker that
// starts a second YAML document, or 0. Viper would silently read only the
// first, dropping whatever an operator put after the marker. A marker at
// column 0 always separates documents in YAML, even inside block scalars,
// so a line scan is exact.
func secondDocument(data []byte) int {
	content := false
	for n, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		isMarker := func(m string) bool {
			return bytes.HasPrefix(line, []byte(m)) && (len(line) == 3 || line[3] == ' ' || line[3] == '\t')
		}
		if isMarker("---") || isMarker("...") {
			if content {
				return n + 1
			}
			continue
		}
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && t[0] != '%' {
			content = true
		}
	}
	return 0
}

// decode turns the top-level mapping into a Config with defaults applied.
func (d *decoder) decode(raw map[string]any) *Config {
	cfg := &Config{}
	groups, hasGroups := raw[groupsKey]
	delete(raw, groupsKey)
	decodeMapping(d, configSchema, cfg, "", "", raw)
	applyDefaults(d, configSchema, cfg, "")
	if m, isMap := groups.(map[string]any); !hasGroups || isMap && len(m) == 0 {
		d.problem(groupsKey, "no groups; define at least one tenant group")
	} else {
		d.decodeGroups(cfg, groups)
	}
	return cfg
}

func (d *decoder) decodeGroups(cfg *Config, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(groupsKey, "want a mapping of group name to settings, got %s", describe(v))
		return
	}
	for _, name := range sortedKeys(m) {
		key := groupsKey + "." + name
		if why := groupNameProblem(name); why != "" {
			d.fail(key, "%s", why)
			continue
		}
		g := Group{Name: name}
		switch body := m[name].(type) {
		case map[string]any:
			decodeMapping(d, groupSchema, &g, key+".", "", body)
		case nil:
		default:
			d.fail(key, "want a mapping of the group's settings, got %s", describe(body))
			continue
		}
		applyDefaults(d, groupSchema, &g, key+".")
		present := func(k string) bool { return d.present[key+"."+k] }
		deriveGroupDefaults(&g, present)
		// A derived value computed from a bad one is bad too.
		for _, f := range groupFields {
			if from, ok := f.def.(derivedFrom); ok && !present(f.key) && d.bad[key+"."+string(from)] {
				d.bad[key+"."+f.key] = true
			}
		}
		cfg.Groups = append(cfg.Groups, g)
	}
}

// groupNameProblem says why name cannot be a group name, or "". Names
// become directories under run_dir and log_dir and cgroup names, so they
// are kept to what is safe as one path element everywhere.
func groupNameProblem(name string) string {
	const why = "group names are 1-32 lower-case letters, digits, '-' or '_', starting with a letter or digit (they become directory and cgroup names)"
	if name == "" || len(name) > 32 {
		return why
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return why
		}
	}
	return ""
}

// decodeMapping decodes the mapping m found at rel (relative to root, the
// key path of T's table in the file) into dst.
func decodeMapping[T any](d *decoder, s *schema[T], dst *T, root, rel string, m map[string]any) {
	for _, k := range sortedKeys(m) {
		key := k
		if rel != "" {
			key = rel + "." + k
		}
		v := m[k]
		if i, ok := s.index[key]; ok {
			d.present[root+key] = true
			d.decodeLeaf(root+key, s.fields[i].ref(dst), v)
			continue
		}
		if s.sections[key] {
			switch sub := v.(type) {
			case map[string]any:
				decodeMapping(d, s, dst, root, key, sub)
			case nil: // an empty section: every key takes its default
			default:
				d.fail(root+key, "want a mapping, got %s", describe(v))
			}
			continue
		}
		if guess := closestKey(s, key); guess != "" {
			d.problem(root+key, "unknown key (did you mean %s?)", root+guess)
		} else {
			d.problem(root+key, "unknown key")
		}
	}
}

// applyDefaults sets every key of the table the file left out.
func applyDefaults[T any](d *decoder, s *schema[T], dst *T, root string) {
	for _, f := range s.fields {
		key := root + f.key
		if d.present[key] || !d.ok(sectionOf(key)) {
			continue
		}
		switch f.def.(type) {
		case marker:
			d.fail(key, "required")
		case derivedFrom:
		default:
			if !decodeDefault(f.ref(dst), f.def) {
				panic("policy: the default of " + f.key + " does not decode")
			}
		}
	}
}

// sectionOf returns the key of the mapping or list holding key ("a.b"
// for "a.b.c" and for "a.b[2]").
func sectionOf(key string) string {
	if strings.HasSuffix(key, "]") {
		if i := strings.LastIndexByte(key, '['); i > 0 {
			return key[:i]
		}
	}
	if i := strings.LastIndexByte(key, '.'); i > 0 {
		return key[:i]
	}
	return ""
}

// decodeDefault decodes a table default; false means the table is wrong.
func decodeDefault(dst, def any) bool {
	d := newDecoder()
	d.decodeLeaf("default", dst, def)
	return len(d.problems) == 0
}

// decodeLeaf decodes one value into dst, whose type says what the key
// holds.
func (d *decoder) decodeLeaf(key string, dst, v any) {
	switch p := dst.(type) {
	case *string:
		s, ok := v.(string)
		if !ok {
			d.fail(key, "want a string, got %s", describe(v))
			return
		}
		*p = s
	case *bool:
		b, ok := v.(bool)
		if !ok {
			d.fail(key, "want true or false, got %s", describe(v))
			return
		}
		*p = b
	case *int:
		n, ok := wholeNumber(v)
		if !ok {
			d.fail(key, "want a whole number, got %s", describe(v))
			return
		}
		*p = n
	case *time.Duration:
		s, ok := v.(string)
		if !ok {
			d.fail(key, "want a duration such as 2s or 500ms, got %s", describe(v))
			return
		}
		dur, err := time.ParseDuration(s)
		if err != nil {
			d.fail(key, "%q is not a duration (such as 2s, 500ms or 10m)", s)
			return
		}
		*p = dur
	case *size:
		switch x := v.(type) {
		case string:
			n, err := units.ParseSize(x)
			if err != nil {
				d.fail(key, "%s", strings.TrimPrefix(err.Error(), "units: "))
				return
			}
			*p = size(n)
		default:
			n, ok := wholeNumber(v)
			if !ok || n < 0 {
				d.fail(key, "want a size such as 8G, 512M or a number of bytes, got %s", describe(v))
				return
			}
			*p = size(n)
		}
	case *[]string:
		list, ok := v.([]any)
		if !ok {
			d.fail(key, "want a list such as [a, b], got %s", describe(v))
			return
		}
		out := make([]string, 0, len(list))
		for i, e := range list {
			switch e := e.(type) {
			case string:
				out = append(out, e)
			case int, int64, uint64:
				out = append(out, fmt.Sprint(e))
			default:
				d.fail(fmt.Sprintf("%s[%d]", key, i), "want a name or number, got %s", describe(e))
			}
		}
		*p = out
	default:
		panic(fmt.Sprintf("policy: key %s has unsupported type %T", key, dst))
	}
}

// wholeNumber accepts the integer types YAML decodes into; floats are
// refused even when integral, since 48.0 clients is a typo.
func wholeNumber(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		if x < math.MinInt || x > math.MaxInt {
			return 0, false
		}
		return int(x), true
	case uint64:
		if x > math.MaxInt {
			return 0, false
		}
		return int(x), true
	}
	return 0, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// closestKey suggests the known key nearest to an unknown one (edit
// distance at most 2), or "".
func closestKey[T any](s *schema[T], key string) string {
	best, bestDist := "", 3
	consider := func(k string) {
		if dist := editDistance(key, k); dist < bestDist || dist == bestDist && k < best {
			best, bestDist = k, dist
		}
	}
	for _, f := range s.fields {
		consider(f.key)
	}
	for k := range s.sections {
		consider(k)
	}
	if s == any(configSchema) {
		consider(groupsKey)
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
