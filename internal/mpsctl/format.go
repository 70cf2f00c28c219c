package mpsctl

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// none stands for an empty cell.
const none = "-"

// Names resolves a uid to a user name for status; "" when it has none.
type Names func(uid uint32) string

// WriteStatus is WriteStatusView with the default view: every section,
// with headers, commands cut.
func WriteStatus(w io.Writer, st api.Status, names Names) error {
	return WriteStatusView(w, st, names, StatusView{})
}

// StatusView says how WriteStatusView shows a status document.
type StatusView struct {
	// Wide shows whole GPU UUIDs and commands, the uid each instance's
	// MPS serves (SERVING) and the pids of its clients of no lease.
	Wide bool
	// NoHeaders leaves out the summary line, the sections' titles, the
	// tables' header rows, the notes below them and "(none)": rows
	// only, for scripts (with Only, one table's).
	NoHeaders bool
	// Only, when set, shows only these sections: "instances",
	// "running", "queued" (a filter by a lease state, or by user, shows
	// leases only; by an instance state, instances only).
	Only []string
}

func (v StatusView) shows(section string) bool {
	return len(v.Only) == 0 || slices.Contains(v.Only, section)
}

// WriteStatusView renders st for people: a summary line, then the
// INSTANCES, RUNNING and QUEUED tables (QUEUE, the counts per group, for
// a non-admin's view), each sorted stably whatever order mpsd sent them
// in: instances by GPU then group, running leases by group then id,
// queued ones by group then their position, the order mpsd grants in.
// Users are shown by name (names; nil shows uids), falling back to the
// uid. An instance shows the memory its leases were granted (MEM) and
// what all its MPS clients hold (USED), and NOTE names the clients of no
// lease among them. A lease shows its launcher's pid (LAUNCHER) beside its
// workload's (PIDS); a running one its SM share and how it is divided
// (PROCS: "4x7%", four processes of 7% each), the MPS clients mpsd saw of
// it (CLIENTS, "5!" and a line below the table when more than its
// processes) and its memory limit and use (MEM, USED).
func WriteStatusView(w io.Writer, st api.Status, names Names, v StatusView) error {
	var b bytes.Buffer
	user := func(uid uint32) string {
		if names != nil {
			if n := names(uid); n != "" {
				return cell(n)
			}
		}
		return strconv.FormatUint(uint64(uid), 10)
	}
	var running, queued []api.LeaseStatus
	for _, l := range st.Leases {
		if l.State == api.LeaseRunning {
			running = append(running, l)
		} else {
			queued = append(queued, l)
		}
	}
	// title starts a section: a blank line after the one before, and its
	// name; what follows it only when headers are shown.
	first := true
	title := func(name string) {
		if v.NoHeaders {
			return
		}
		if !first {
			b.WriteString("\n")
		}
		first = false
		b.WriteString(name + "\n")
	}
	notes := func(s string) {
		if !v.NoHeaders {
			b.WriteString(s)
		}
	}
	header := func(tw io.Writer, h string) {
		if !v.NoHeaders {
			fmt.Fprintln(tw, h)
		}
	}
	commandText := func(argv []string) string {
		if v.Wide {
			return argvText(argv, math.MaxInt)
		}
		return argvText(argv, maxCommand)
	}

	if !v.NoHeaders {
		b.WriteString(summary(st, len(running), len(queued)) + "\n\n")
	}

	if v.shows("instances") {
		title("INSTANCES")
		if len(st.Instances) == 0 {
			notes("  (none)\n")
		} else {
			inst := slices.Clone(st.Instances)
			slices.SortStableFunc(inst, func(a, b api.InstanceStatus) int {
				return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group), cmp.Compare(a.GPUUUID, b.GPUUUID))
			})
			tw := newTable(&b)
			wide := ""
			if v.Wide {
				wide = "\tSERVING"
			}
			header(tw, "GPU\tUUID\tGROUP\tSTATE\tDAEMON\tSERVERS\tCLIENTS\tSM%\tMEM\tUSED\tRESTARTS"+wide+"\tNOTE")
			for _, in := range inst {
				uuids := instanceUUIDs(in)
				if v.Wide {
					uuids = cell(strings.Join(in.GPUUUIDs, ","))
					if len(in.GPUUUIDs) == 0 {
						uuids = cell(in.GPUUUID)
					}
					wide = "\t" + none
					if in.ServingUID != nil && *in.ServingUID >= 0 {
						wide = "\t" + user(uint32(*in.ServingUID))
					}
				}
				note := instanceNote(in)
				switch u := unleasedNote(in, user, v.Wide); {
				case u == "":
				case note == none:
					note = u
				default:
					note = u + "; " + note
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%s/%s\t%s\t%d%s\t%s\n",
					instanceGPUs(in), uuids, cell(in.Group), cell(in.State),
					pid(in.DaemonPID), pids(in.ServerPIDs),
					instanceClients(in), in.MaxClients, in.SMAllocated, in.SMBudget,
					units.FormatSize(in.MemAllocatedBytes), units.FormatSize(in.MemBudgetBytes),
					size(in.MemUsedBytes), in.Restarts, wide, note)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if !v.NoHeaders {
				writeShared(&b, inst)
				writeVersions(&b, inst)
			}
		}
		if !v.NoHeaders {
			writeMpsdVersion(&b, st)
		}
	}

	own := ""
	if st.OwnOnly {
		own = "  (yours only: mpsd shows other users' leases to admins)\n"
	}
	if v.shows("running") {
		title("RUNNING")
		notes(own)
		if len(running) == 0 {
			notes("  (none)\n")
		} else {
			slices.SortStableFunc(running, func(a, b api.LeaseStatus) int {
				return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.ID, b.ID))
			})
			tw := newTable(&b)
			header(tw, "ID\tGROUP\tUSER\tJOB\tGPUS\tSM%\tPROCS\tCLIENTS\tMEM\tUSED\tATTEMPT\tRUNNING\tLAUNCHER\tPIDS\tCOMMAND")
			for _, l := range running {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
					cell(l.ID), cell(l.Group), user(l.UID), cell(l.JobID), ints(l.GPUIndexes), l.SM, procsText(l), clientsText(l),
					units.FormatSize(l.MemBytes), memUsed(l), l.Attempt, since(st.At, l.RunningSince), pid(l.LauncherPID), pids(l.PIDs), commandText(l.Command))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// A lease that runs more MPS clients than it declared: each has its
			// part of the share, so together they take more than the share.
			for _, l := range running {
				if n, procs := clientsSeen(l), leaseProcs(l); n > procs {
					notes(fmt.Sprintf("  %s: %d MPS clients, more than its %d declared processes (--procs): at %d%% each they can take %d%%, over its sm %d%%\n",
						cell(l.ID), n, procs, perProcess(l), n*perProcess(l), l.SM))
				}
			}
		}
	}

	if v.shows("queued") {
		title("QUEUED")
		notes(own)
		if len(queued) == 0 {
			notes("  (none)\n")
		} else {
			slices.SortStableFunc(queued, func(a, b api.LeaseStatus) int {
				return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(position(a), position(b)), cmp.Compare(a.ID, b.ID))
			})
			tw := newTable(&b)
			header(tw, "GROUP\tPOS\tID\tUSER\tJOB\tSM%\tPROCS\tMEM\tATTEMPT\tWAITING\tLAUNCHER\tCOMMAND")
			for _, l := range queued {
				pos := none
				if l.Position > 0 {
					pos = strconv.Itoa(l.Position)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n",
					cell(l.Group), pos, cell(l.ID), user(l.UID), cell(l.JobID), l.SM, procsText(l),
					units.FormatSize(l.MemBytes), l.Attempt, since(st.At, l.QueuedSince), pid(l.LauncherPID), commandText(l.Command))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// What a group's queue waits for, as mps-launch shows it: one
			// reason per group (mpsd gives its leases the same one).
			var reasons []string
			for _, l := range queued {
				r := cell(l.Group) + ": " + text(l.WaitReason, 200)
				if l.WaitReason != "" && !slices.Contains(reasons, r) {
					reasons = append(reasons, r)
				}
			}
			for _, r := range reasons {
				notes("  " + r + "\n")
			}
		}
	}

	if st.OwnOnly && len(st.Queue) > 0 && !v.NoHeaders && (v.shows("running") || v.shows("queued")) {
		b.WriteString("\nQUEUE (everyone's)\n")
		tw := newTable(&b)
		groups := make([]string, 0, len(st.Queue))
		for g := range st.Queue {
			groups = append(groups, g)
		}
		slices.Sort(groups)
		fmt.Fprintln(tw, "GROUP\tQUEUED\tRUNNING")
		for _, g := range groups {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", cell(g), st.Queue[g], st.Running[g])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// unleasedNote is NOTE's part about the MPS clients of an instance that
// no lease accounts for: "unleased: 1 client of uid 1002, 2G of USED"
// (their users by name; wide, their pids too); "" when it has none.
func unleasedNote(in api.InstanceStatus, user func(uint32) string, wide bool) string {
	if len(in.Unleased) == 0 {
		return ""
	}
	var who []string
	var uids []uint32
	var ps []int
	for _, c := range in.Unleased {
		if !slices.Contains(uids, c.UID) {
			uids = append(uids, c.UID)
			who = append(who, user(c.UID))
		}
		ps = append(ps, c.PID)
	}
	n := "1 client"
	if len(in.Unleased) > 1 {
		n = fmt.Sprintf("%d clients", len(in.Unleased))
	}
	users := "user " + strings.Join(who, ",")
	if len(who) > 1 {
		users = "users " + strings.Join(who, ",")
	}
	note := fmt.Sprintf("unleased: %s of %s", n, users)
	if wide {
		note += " (pids " + pids(ps) + ")"
	}
	return note + ", " + units.FormatSize(in.UnleasedMemBytes) + " of USED"
}

// size is a byte count from mpsd that may be missing ("-").
func size(n *uint64) string {
	if n == nil || *n > math.MaxInt64 {
		return none
	}
	return units.FormatSize(int64(*n))
}

// summary is status's first line: instances by state, leases running
// and queued (everyone's, also in a non-admin's view), what the running
// leases were granted of the instances' budgets, summed over every GPU
// of every instance (memory in bytes, MPS clients in clients: no
// percentage, which would average GPUs unlike each other), and what MPS
// serves that no lease accounts for (clients and their memory, an
// admin's view only).
func summary(st api.Status, running, queued int) string {
	byState := map[string]int{}
	var clients, maxClients, unleased int
	var memGranted, memBudget, memUnleased int64
	for _, in := range st.Instances {
		byState[in.State]++
		n := int64(max(len(in.GPUIndexes), 1))
		memGranted += in.MemAllocatedBytes * n
		memBudget += in.MemBudgetBytes * n
		clients += instanceClients(in)
		maxClients += in.MaxClients
		unleased += len(in.Unleased)
		for _, c := range in.Unleased {
			if c.MemBytes != nil && *c.MemBytes <= math.MaxInt64 {
				memUnleased += int64(*c.MemBytes)
			}
		}
	}
	var states []string
	for _, s := range instanceStates {
		if byState[s] > 0 {
			states = append(states, fmt.Sprintf("%d %s", byState[s], s))
			delete(byState, s)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(byState)) {
		states = append(states, fmt.Sprintf("%d %s", byState[s], cell(s)))
	}
	if len(states) == 0 {
		states = []string{"none"}
	}
	if st.OwnOnly {
		running, queued = 0, 0
		for _, n := range st.Running {
			running += n
		}
		for _, n := range st.Queue {
			queued += n
		}
	}
	line := fmt.Sprintf("instances: %s; leases: %d running, %d queued; granted: mem %s of %s, clients %d of %d",
		strings.Join(states, ", "), running, queued,
		units.FormatSize(memGranted), units.FormatSize(memBudget), clients, maxClients)
	if unleased > 0 {
		c := "clients"
		if unleased == 1 {
			c = "client"
		}
		line += fmt.Sprintf("; unleased: %d %s, mem %s", unleased, c, units.FormatSize(memUnleased))
	}
	return line
}

// instanceStates are the instance states in the order the summary counts
// them; a state mpsd sends that is not among them is counted after, by
// name.
var instanceStates = []string{api.InstanceReady, api.InstanceStarting, api.InstanceRecovering, api.InstanceDraining, api.InstanceDrained, api.InstanceRetiring, api.InstanceQuarantined}

// instanceClients is how many of its max_clients an instance's leases
// take: one per declared process (an mpsd before clients_allocated sends
// only the number of leases, one each).
func instanceClients(in api.InstanceStatus) int { return max(in.ClientsAllocated, in.Clients) }

// leaseProcs is how many processes a lease's share is divided among (1
// from an mpsd before procs).
func leaseProcs(l api.LeaseStatus) int { return max(l.Procs, 1) }

// perProcess is each process's part of a lease's share.
func perProcess(l api.LeaseStatus) int {
	if l.SMPerProcess > 0 {
		return l.SMPerProcess
	}
	return l.SM / leaseProcs(l)
}

// procsText is a lease's processes and each one's share of the SMs:
// "4x7%" for 30% divided among 4; "1" for one process, which has all.
func procsText(l api.LeaseStatus) string {
	if p := leaseProcs(l); p > 1 {
		return fmt.Sprintf("%dx%d%%", p, perProcess(l))
	}
	return "1"
}

// clientsSeen is the MPS clients mpsd saw of the lease; -1 when unknown.
func clientsSeen(l api.LeaseStatus) int {
	if l.Clients == nil {
		return -1
	}
	return *l.Clients
}

// clientsText is the MPS clients seen of a lease, with "!" when more than
// its declared processes; "-" before mpsd has looked.
func clientsText(l api.LeaseStatus) string {
	n := clientsSeen(l)
	switch {
	case n < 0:
		return none
	case n > leaseProcs(l):
		return strconv.Itoa(n) + "!"
	}
	return strconv.Itoa(n)
}

// memUsed is the device memory NVML reports for a lease's processes;
// "-" before mpsd has read it.
func memUsed(l api.LeaseStatus) string {
	if l.MemUsedBytes == nil || *l.MemUsedBytes > math.MaxInt64 {
		return none
	}
	return units.FormatSize(int64(*l.MemUsedBytes))
}

// instanceNote says what holds an instance besides its state: a drain,
// why it is quarantined, and why its control daemon does not start.
func instanceNote(in api.InstanceStatus) string {
	var note []string
	if in.Multiuser {
		note = append(note, "multiuser")
	}
	if in.Drained {
		if r := drainRecord(in); r != "" {
			note = append(note, "drained "+r)
		} else {
			note = append(note, "drained")
		}
	}
	if in.State == api.InstanceQuarantined {
		note = append(note, "quarantined: "+text(in.QuarantineReason, 100))
	}
	if in.LastStartError != "" {
		// An error names its cause last (what the daemon said).
		note = append(note, "start failed: "+tailText(in.LastStartError, 100))
	}
	for _, s := range in.Servers {
		if s.Fault {
			note = append(note, fmt.Sprintf("server %d in FAULT: new clients are refused until the clients of no lease of its fault have gone", s.PID))
		}
		if len(s.PendingLeases) > 0 {
			// MPS's pending list: their clients wait inside MPS.
			who := "lease " + text(s.PendingLeases[0], 60) + " waits"
			if len(s.PendingLeases) > 1 {
				who = "leases " + text(strings.Join(s.PendingLeases, ","), 60) + " wait"
			}
			note = append(note, fmt.Sprintf("server %d of uid %d: %s behind it inside MPS", s.PID, s.UID, who))
		}
		switch {
		case s.UnleasedClients == 0:
		case in.Multiuser:
			note = append(note, fmt.Sprintf("server %d: clients of no lease (%d)", s.PID, s.UnleasedClients))
		default:
			// MPS serves one uid at a time: the rest wait inside it.
			note = append(note, fmt.Sprintf("server %d of uid %d held by clients of no lease (%d): other users wait", s.PID, s.UID, s.UnleasedClients))
		}
	}
	if len(note) == 0 {
		return none
	}
	return strings.Join(note, "; ")
}

// writeShared says, for each group whose instances share one MPS server
// among their members (multiuser), that its leases' SM shares are
// advisory there.
func writeShared(b *bytes.Buffer, inst []api.InstanceStatus) {
	var groups []string
	for _, in := range inst {
		if in.Multiuser && !slices.Contains(groups, in.Group) {
			groups = append(groups, in.Group)
		}
	}
	slices.Sort(groups)
	for _, g := range groups {
		fmt.Fprintf(b, "  group %s shares one MPS server among its members (multiuser): a lease's SM%% is advisory there, within the group's cap; its MEM is enforced\n", cell(g))
	}
}

// position orders queued leases without a position (an older mpsd) last.
func position(l api.LeaseStatus) int {
	if l.Position <= 0 {
		return math.MaxInt
	}
	return l.Position
}

// since is the time from t to at, to the second (tenths below ten
// seconds); "-" when either is unknown.
func since(at, t time.Time) string {
	if at.IsZero() || t.IsZero() {
		return none
	}
	d := max(at.Sub(t), 0)
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// maxCommand bounds the command column, in characters.
const maxCommand = 48

// argvText is a lease's argv for a table's last column: arguments with
// blanks or quotes quoted, control characters shown as '?', cut to n
// characters with an ellipsis.
func argvText(argv []string, n int) string {
	if len(argv) == 0 {
		return none
	}
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\"'\\") {
			a = strconv.Quote(a)
		}
		parts[i] = a
	}
	return text(strings.Join(parts, " "), n)
}

// text is free text from mpsd for a table: control characters become
// '?', and it is cut to n characters with an ellipsis; empty is "-".
func text(s string, n int) string {
	if s == "" {
		return none
	}
	r := []rune(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s))
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return string(r)
}

// tailText is text cut at its start instead, keeping its last n
// characters.
func tailText(s string, n int) string {
	r := []rune(text(s, len(s)+1))
	if len(r) > n {
		return "…" + string(r[len(r)-n+1:])
	}
	return string(r)
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

// WriteResumeResult writes one line per instance a resume touched,
// saying what it lifted: "gpu 0 (GPU-1234abcd…) group a: drain lifted;
// quarantine lifted (was: 5 failures in 10m0s; ...); state ready", in the
// order of WriteStatus. An mpsd that does not say what it lifted (no
// Lifted list) gets WriteAdminResult's lines.
func WriteResumeResult(w io.Writer, res api.AdminResult) error {
	if len(res.Instances) == 0 || len(res.Lifted) != len(res.Instances) {
		return WriteAdminResult(w, "resumed", res)
	}
	order := make([]int, len(res.Instances))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		a, b := res.Instances[i], res.Instances[j]
		return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group))
	})
	var b bytes.Buffer
	for _, i := range order {
		in, l := res.Instances[i], res.Lifted[i]
		var what []string
		if l.Drain {
			what = append(what, "drain lifted")
		}
		if l.Quarantine {
			q := "quarantine lifted"
			if l.QuarantineReason != "" {
				q += " (was: " + text(l.QuarantineReason, 200) + ")"
			}
			what = append(what, q)
		}
		if len(what) == 0 {
			what = append(what, "nothing to lift (neither drained nor quarantined)")
		}
		fmt.Fprintf(&b, "gpu %s (%s) group %s: %s; state %s\n",
			instanceGPUs(in), instanceUUIDs(in), cell(in.Group), strings.Join(what, "; "), cell(in.State))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteShutdownResult writes what mpsctl shutdown did, one line, then a
// line per problem.
func WriteShutdownResult(w io.Writer, res api.ShutdownResult) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "mpsd shut down: %d running lease(s) revoked, %d queued request(s) refused, %d MPS control daemon(s) stopped, compute modes restored where mpsd had set them\n",
		res.Revoked, res.Withdrawn, res.Daemons)
	for _, p := range res.Problems {
		fmt.Fprintf(&b, "  problem: %s\n", text(p, 500))
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
