package mpsctl

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// none stands for an empty cell.
const none = "-"

// WriteStatus renders st for people: the INSTANCES, LEASES and QUEUE
// tables, each sorted stably (instances by GPU then group, leases by group
// then id, queues by group) whatever order mpsd sent them in.
func WriteStatus(w io.Writer, st api.Status) error {
	var b bytes.Buffer

	b.WriteString("INSTANCES\n")
	if len(st.Instances) == 0 {
		b.WriteString("  (none)\n")
	} else {
		inst := slices.Clone(st.Instances)
		slices.SortStableFunc(inst, func(a, b api.InstanceStatus) int {
			return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group), cmp.Compare(a.GPUUUID, b.GPUUUID))
		})
		tw := newTable(&b)
		fmt.Fprintln(tw, "GPU\tUUID\tGROUP\tSTATE\tDAEMON\tSERVERS\tCLIENTS\tSM%\tMEM\tRESTARTS")
		for _, in := range inst {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%s/%s\t%d\n",
				instanceGPUs(in), instanceUUIDs(in), cell(in.Group), cell(in.State),
				pid(in.DaemonPID), pids(in.ServerPIDs),
				in.Clients, in.MaxClients, in.SMAllocated, in.SMBudget,
				units.FormatSize(in.MemAllocatedBytes), units.FormatSize(in.MemBudgetBytes),
				in.Restarts)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		writeVersions(&b, inst)
	}

	b.WriteString("\nLEASES\n")
	if st.OwnOnly {
		b.WriteString("  (yours only: mpsd shows other users' leases to admins)\n")
	}
	if len(st.Leases) == 0 {
		b.WriteString("  (none)\n")
	} else {
		leases := slices.Clone(st.Leases)
		slices.SortStableFunc(leases, func(a, b api.LeaseStatus) int {
			return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.ID, b.ID))
		})
		tw := newTable(&b)
		fmt.Fprintln(tw, "ID\tGROUP\tUID\tJOB\tGPUS\tSM%\tMEM\tATTEMPT\tSTATE\tPIDS")
		for _, l := range leases {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n",
				cell(l.ID), cell(l.Group), l.UID, cell(l.JobID), ints(l.GPUIndexes), l.SM,
				units.FormatSize(l.MemBytes), l.Attempt, cell(l.State), pids(l.PIDs))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	b.WriteString("\nQUEUE\n")
	if len(st.Queue) == 0 {
		b.WriteString("  (none)\n")
	} else {
		tw := newTable(&b)
		groups := make([]string, 0, len(st.Queue))
		for g := range st.Queue {
			groups = append(groups, g)
		}
		slices.Sort(groups)
		if st.Running != nil {
			// A non-admin's view: everyone's counts per group.
			fmt.Fprintln(tw, "GROUP\tQUEUED\tRUNNING")
			for _, g := range groups {
				fmt.Fprintf(tw, "%s\t%d\t%d\n", cell(g), st.Queue[g], st.Running[g])
			}
		} else {
			fmt.Fprintln(tw, "GROUP\tQUEUED")
			for _, g := range groups {
				fmt.Fprintf(tw, "%s\t%d\n", cell(g), st.Queue[g])
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// writeVersions adds, below the instances, each driver and MPS version
// they run on and how many run on it ("MPS 13000 (driver 580.159.04): 2
// instances"); nothing when mpsd names none.
func writeVersions(b *bytes.Buffer, inst []api.InstanceStatus) {
	type ver struct{ mps, driver string }
	count := map[ver]int{}
	var order []ver
	for _, in := range inst {
		if in.DriverVersion == "" && in.MPSVersion == "" {
			continue
		}
		v := ver{cell(in.MPSVersion), cell(in.DriverVersion)}
		if count[v] == 0 {
			order = append(order, v)
		}
		count[v]++
	}
	slices.SortFunc(order, func(a, b ver) int { return cmp.Or(cmp.Compare(a.driver, b.driver), cmp.Compare(a.mps, b.mps)) })
	for _, v := range order {
		n := "instances"
		if count[v] == 1 {
			n = "instance"
		}
		fmt.Fprintf(b, "  MPS %s (driver %s): %d %s\n", v.mps, v.driver, count[v], n)
	}
}

// WriteStatusJSON writes the status document raw as mpsd sent it,
// indented by two spaces and ending in a newline: fields this version of
// mpsctl does not know are kept, and the order is mpsd's (struct order,
// map keys sorted), so the output is stable.
func WriteStatusJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(raw), "", "  "); err != nil {
		return fmt.Errorf("%w: status document: %v", ErrBadAnswer, err)
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// WriteAdminResult writes one line per instance an admin command changed,
// "drained gpu 0 (GPU-1234abcd…) group inference: state draining", in the
// order of WriteStatus; verb is the command's past tense. An empty result
// says so in one line.
func WriteAdminResult(w io.Writer, verb string, res api.AdminResult) error {
	if len(res.Instances) == 0 {
		_, err := fmt.Fprintf(w, "no instance %s\n", verb)
		return err
	}
	inst := slices.Clone(res.Instances)
	slices.SortStableFunc(inst, func(a, b api.InstanceStatus) int {
		return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group))
	})
	var b bytes.Buffer
	for _, in := range inst {
		fmt.Fprintf(&b, "%s gpu %s (%s) group %s: state %s\n",
			verb, instanceGPUs(in), instanceUUIDs(in), cell(in.Group), cell(in.State))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteRequeueResult writes the one line of requeue, "requeued lease ID
// (was on gpu 0 group inference)", naming the instance the lease was on
// (res, in the order of WriteStatus); an empty result leaves the
// parenthesis out.
func WriteRequeueResult(w io.Writer, lease string, res api.AdminResult) error {
	if len(res.Instances) == 0 {
		_, err := fmt.Fprintf(w, "requeued lease %s\n", cell(lease))
		return err
	}
	inst := slices.Clone(res.Instances)
	slices.SortStableFunc(inst, func(a, b api.InstanceStatus) int {
		return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group))
	})
	on := make([]string, len(inst))
	for i, in := range inst {
		on[i] = fmt.Sprintf("gpu %s group %s", instanceGPUs(in), cell(in.Group))
	}
	_, err := fmt.Fprintf(w, "requeued lease %s (was on %s)\n", cell(lease), strings.Join(on, ", "))
	return err
}

// ShortUUID shortens a GPU UUID to its first eight hex digits and an
// ellipsis, "GPU-1234abcd…", enough to tell a host's GPUs apart and to be
// given back as a UUID prefix; shorter strings are returned as they are.
func ShortUUID(uuid string) string {
	const keep = len("GPU-") + 8
	r := []rune(cell(uuid))
	if len(r) <= keep {
		return string(r)
	}
	return string(r[:keep]) + "…"
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
}

// instanceGPUs is the instance's GPU indexes, "0" or "4,5".
func instanceGPUs(in api.InstanceStatus) string {
	if len(in.GPUIndexes) > 1 {
		return ints(in.GPUIndexes)
	}
	return strconv.Itoa(in.GPUIndex)
}

// instanceUUIDs is the instance's short GPU UUIDs, comma-separated.
func instanceUUIDs(in api.InstanceStatus) string {
	if len(in.GPUUUIDs) > 1 {
		s := make([]string, len(in.GPUUUIDs))
		for i, u := range in.GPUUUIDs {
			s[i] = ShortUUID(u)
		}
		return strings.Join(s, ",")
	}
	return ShortUUID(in.GPUUUID)
}

func ints(v []int) string {
	if len(v) == 0 {
		return none
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func pids(v []int) string { return ints(v) }

func pid(p int) string {
	if p <= 0 {
		return none
	}
	return strconv.Itoa(p)
}

// cell keeps a table cell one visible word: empty becomes "-", and control
// characters and blanks (a name from mpsd is data, not layout) become '?'.
func cell(s string) string {
	if s == "" {
		return none
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return '?'
		}
		return r
	}, s)
}
