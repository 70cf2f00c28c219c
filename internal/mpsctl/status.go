package mpsctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/cli"
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/internal/gpusel"
)

// statusLong is `mpsctl help status`.
const statusLong = "Shows mpsd's MPS instances, the leases running and queued, and the queue\n" +
	"length of every group. Admins see every lease, and per instance the MPS\n" +
	"clients no lease accounts for (their users and memory, summed into USED);\n" +
	"anyone else sees their own leases, the leases running and queued per group,\n" +
	"and no pids. Filters narrow what is shown, in the table and the JSON alike:\n" +
	"--group and --gpu instances and leases, --user leases only, --state an\n" +
	"instance state (instances only) or a lease state (those leases only).\n" +
	"-o json (or --json) prints the status document as mpsd sent it; -o wide\n" +
	"adds whole UUIDs and commands, the uid each instance's MPS serves and the\n" +
	"pids of its clients of no lease. --watch redraws every INTERVAL (default\n" +
	"2s) until interrupted, clearing a terminal's screen first."

// defaultWatch is --watch's interval when it names none.
const defaultWatch = 2 * time.Second

// watchFlag is --watch [INTERVAL]: a flag whose value is optional.
type watchFlag struct {
	on    bool
	every time.Duration
}

func (w *watchFlag) String() string {
	if !w.on {
		return ""
	}
	return w.every.String()
}

func (w *watchFlag) IsBoolFlag() bool { return true }

func (w *watchFlag) Set(v string) error {
	switch v {
	case "true":
		w.on, w.every = true, defaultWatch
		return nil
	case "false":
		w.on = false
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 100*time.Millisecond {
		return errors.New("want an interval of 100ms or more, such as 2s or 1m")
	}
	w.on, w.every = true, d
	return nil
}

// statusFilter is what status's filters keep; the zero value keeps all.
type statusFilter struct {
	group string
	gpu   string // a selector: an index, a UUID or a UUID prefix
	user  string // a name or a uid
	state string
}

// leaseStates and the instance states (instanceStates) are what --state
// takes.
var leaseStates = []string{api.LeaseRunning, api.LeaseQueued}

func statusCommand(fs *flag.FlagSet) runFunc {
	asJSON := fs.Bool("json", false, "print the status document as mpsd sent it (indented JSON); as -o json")
	output := fs.String("o", "", "output `FORMAT`: wide (whole UUIDs and commands, more columns) or json")
	noHeaders := fs.Bool("no-headers", false, "print the tables' rows only: no summary, titles, header rows or notes")
	var f statusFilter
	fs.StringVar(&f.group, "group", "", "show only group `G`'s instances and leases")
	fs.StringVar(&f.gpu, "gpu", "", "show only the instances and running leases on GPU `SEL` (an index, a UUID or a UUID prefix)")
	fs.StringVar(&f.user, "user", "", "show only user `U`'s leases (a name or a uid)")
	fs.StringVar(&f.state, "state", "", "show only the instances, or the leases, in state `S` ("+strings.Join(append(slices.Clone(instanceStates), leaseStates...), ", ")+")")
	var watch watchFlag
	fs.Var(&watch, "watch", "redraw every `INTERVAL` (default 2s) until interrupted")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if watch.on && len(args) > 0 {
			// --watch 5s: the interval as the next argument.
			if err := watch.Set(args[0]); err == nil {
				args = args[1:]
			}
		}
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		format := *output
		switch {
		case *asJSON && format != "" && format != "json":
			return usagef("--json and -o %s exclude each other", format)
		case *asJSON:
			format = "json"
		case format != "" && format != "wide" && format != "json":
			msg := fmt.Sprintf("-o %q: want wide or json", format)
			if s := cli.Suggest(format, []string{"wide", "json"}); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			return usagef("%s", msg)
		}
		if f.state != "" && !slices.Contains(instanceStates, f.state) && !slices.Contains(leaseStates, f.state) {
			known := append(slices.Clone(instanceStates), leaseStates...)
			msg := fmt.Sprintf("--state %q: want an instance state (%s) or a lease state (%s)",
				f.state, strings.Join(instanceStates, ", "), strings.Join(leaseStates, ", "))
			if s := cli.Suggest(f.state, known); s != "" {
				msg = fmt.Sprintf("--state %q: did you mean %q? (instance states: %s; lease states: %s)",
					f.state, s, strings.Join(instanceStates, ", "), strings.Join(leaseStates, ", "))
			}
			return usagef("%s", msg)
		}
		var uid *uint32
		if f.user != "" {
			u, err := inv.lookupUID(f.user)
			if err != nil {
				return usagef("--user %q: %v", f.user, err)
			}
			uid = &u
		}
		var sel *gpusel.Selector
		if f.gpu != "" {
			s, err := gpusel.Parse(f.gpu)
			if err != nil || s.Kind() == gpusel.All {
				return usagef("--gpu %q: want a GPU index, a UUID or a UUID prefix", f.gpu)
			}
			sel = &s
		}
		view := StatusView{Wide: format == "wide", NoHeaders: *noHeaders}
		switch {
		case slices.Contains(leaseStates, f.state):
			view.Only = []string{f.state}
		case f.state != "":
			view.Only = []string{"instances"}
		case uid != nil:
			view.Only = []string{"running", "queued"}
		}
		draw := func(w io.Writer) error {
			st, raw, err := inv.client().Status(ctx)
			if err != nil {
				return err
			}
			keep, err := f.match(st, sel, uid)
			if err != nil {
				return err
			}
			if format == "json" {
				if raw, err = keep.filterJSON(raw, f.group); err != nil {
					return err
				}
				return WriteStatusJSON(w, raw)
			}
			return WriteStatusView(w, keep.apply(st, f.group), inv.names(), view)
		}
		if !watch.on {
			return draw(inv.stdout)
		}
		return inv.watch(ctx, watch.every, draw)
	}
}

// kept is what a filter keeps of one status document: the indexes of its
// instances and of its leases.
type kept struct {
	instances, leases []int
}

// match applies f (with its GPU selector and uid resolved) to st. A GPU
// selector that names no GPU of st's instances, or more than one, is an
// error.
func (f statusFilter) match(st api.Status, sel *gpusel.Selector, uid *uint32) (kept, error) {
	var gpus []int
	if sel != nil {
		var inv []gpusel.GPU
		seen := map[int]bool{}
		for _, in := range st.Instances {
			idx, uuids := in.GPUIndexes, in.GPUUUIDs
			if len(idx) == 0 || len(idx) != len(uuids) {
				idx, uuids = []int{in.GPUIndex}, []string{in.GPUUUID}
			}
			for i, x := range idx {
				if !seen[x] {
					seen[x] = true
					inv = append(inv, gpusel.GPU{Index: x, UUID: uuids[i]})
				}
			}
		}
		pos, err := sel.Resolve(inv)
		if err != nil {
			var have []string
			for _, g := range inv {
				have = append(have, strconv.Itoa(g.Index))
			}
			slices.Sort(have)
			return kept{}, fmt.Errorf("--gpu %q: %w (mpsd's instances are on GPU(s) %s)", f.gpu, err, strings.Join(have, ","))
		}
		for _, p := range pos {
			gpus = append(gpus, inv[p].Index)
		}
	}
	onGPU := func(idx []int) bool {
		return sel == nil || slices.ContainsFunc(idx, func(x int) bool { return slices.Contains(gpus, x) })
	}
	var k kept
	for i, in := range st.Instances {
		idx := in.GPUIndexes
		if len(idx) == 0 {
			idx = []int{in.GPUIndex}
		}
		if (f.group == "" || in.Group == f.group) && onGPU(idx) &&
			(f.state == "" || slices.Contains(leaseStates, f.state) || in.State == f.state) {
			k.instances = append(k.instances, i)
		}
	}
	for i, l := range st.Leases {
		if (f.group == "" || l.Group == f.group) && onGPU(l.GPUIndexes) &&
			(uid == nil || l.UID == *uid) &&
			(f.state == "" || !slices.Contains(leaseStates, f.state) || l.State == f.state) {
			k.leases = append(k.leases, i)
		}
	}
	return k, nil
}

// apply is st with only what k keeps, and, for a group filter, only that
// group's counts.
func (k kept) apply(st api.Status, group string) api.Status {
	out := st
	out.Instances = make([]api.InstanceStatus, 0, len(k.instances))
	for _, i := range k.instances {
		out.Instances = append(out.Instances, st.Instances[i])
	}
	out.Leases = make([]api.LeaseStatus, 0, len(k.leases))
	for _, i := range k.leases {
		out.Leases = append(out.Leases, st.Leases[i])
	}
	if group != "" {
		out.Queue, out.Running = onlyGroup(st.Queue, group), onlyGroup(st.Running, group)
	}
	return out
}

func onlyGroup(m map[string]int, group string) map[string]int {
	if m == nil {
		return nil
	}
	out := map[string]int{}
	if n, ok := m[group]; ok {
		out[group] = n
	}
	return out
}

// filterJSON is the status document raw (as mpsd sent it) with only what
// k keeps: the instances and leases arrays hold only the kept elements,
// and with a group filter the queue and running objects only that
// group's key. Every other key, and every key of a kept element, stays as
// mpsd sent it, in its order.
func (k kept) filterJSON(raw []byte, group string) ([]byte, error) {
	bad := func(err error) ([]byte, error) {
		return nil, fmt.Errorf("%w: status document: %v", ErrBadAnswer, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return bad(fmt.Errorf("not an object"))
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for n := 0; dec.More(); n++ {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return bad(err)
		}
		switch key {
		case "instances":
			v, err = keepElements(v, k.instances)
		case "leases":
			v, err = keepElements(v, k.leases)
		case "queue", "running":
			if group != "" && string(v) != "null" {
				var m map[string]json.RawMessage
				if err = json.Unmarshal(v, &m); err == nil {
					keep := map[string]json.RawMessage{}
					if x, ok := m[group]; ok {
						keep[group] = x
					}
					v, err = json.Marshal(keep)
				}
			}
		}
		if err != nil {
			return bad(err)
		}
		if n > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(key)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// keepElements is the JSON array v with only the elements at idx.
func keepElements(v json.RawMessage, idx []int) (json.RawMessage, error) {
	if string(v) == "null" {
		return v, nil
	}
	var all []json.RawMessage
	if err := json.Unmarshal(v, &all); err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, 0, len(idx))
	for _, i := range idx {
		if i < len(all) {
			out = append(out, all[i])
		}
	}
	return json.Marshal(out)
}

// lookupUID resolves --user: a uid, or a name through Config.LookupUID
// or the host's user database.
func (inv *invocation) lookupUID(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	look := inv.cfg.LookupUID
	if look == nil {
		look = func(name string) (uint32, bool) {
			u, err := user.Lookup(name)
			if err != nil {
				return 0, false
			}
			n, err := strconv.ParseUint(u.Uid, 10, 32)
			return uint32(n), err == nil
		}
	}
	if uid, ok := look(name); ok {
		return uid, nil
	}
	return 0, errors.New("no such user (give a name this host knows, or a uid)")
}

// clearScreen moves a terminal's cursor home and clears its screen.
const clearScreen = "\x1b[H\x1b[2J"

// watch runs draw every interval until ctx ends, on Config.Clock. Each
// drawing is made whole before it is written: on a terminal after
// clearing the screen, with a line naming the interval and mpsctl's
// time; elsewhere after a blank line between drawings. The first
// drawing's error ends the watch; a later one is shown in its place and
// the watch goes on (mpsd restarting, say).
func (inv *invocation) watch(ctx context.Context, every time.Duration, draw func(io.Writer) error) error {
	clk := inv.cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	term := inv.cfg.IsTerminal
	if term == nil {
		term = isTerminal
	}
	onTerm := term(inv.stdout)
	for n := 0; ; n++ {
		var b bytes.Buffer
		if onTerm {
			fmt.Fprintf(&b, "%sEvery %s: mpsctl status    %s\n\n", clearScreen, every, clk.Now().Format(time.DateTime))
		} else if n > 0 {
			b.WriteByte('\n')
		}
		if err := draw(&b); err != nil {
			if n == 0 {
				return err
			}
			fmt.Fprintf(&b, "mpsctl: %s\n", oneLine(err.Error()))
		}
		if _, err := inv.stdout.Write(b.Bytes()); err != nil {
			return err
		}
		t := clk.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
