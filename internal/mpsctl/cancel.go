package mpsctl

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// drainCommand is drain: an admin command over an api.AdminTarget that
// also says why (--reason: what the next admin reads in status; without
// one mpsd records "no reason given", and mpsctl notes it).
func drainCommand(fs *flag.FlagSet) runFunc {
	var t api.AdminTarget
	fs.StringVar(&t.GPU, "gpu", "", "`SEL` names the GPU: an index, a UUID or a UUID prefix")
	fs.StringVar(&t.Group, "group", "", "`NAME` names the tenant group")
	fs.StringVar(&t.Reason, "reason", "", "`TEXT` says why: recorded with who drained and when, shown in status until the resume (default \"no reason given\")")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		if t.GPU == "" && t.Group == "" {
			return usagef("name --gpu, --group or both")
		}
		t.Reason = strings.TrimSpace(t.Reason)
		if t.Reason != "" {
			inv.uses(api.LevelOperatorView)
		}
		if err := t.Validate(); err != nil { // what mpsd would refuse
			return usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": "))
		}
		res, err := inv.client().Admin(ctx, api.PathDrain, t)
		if err != nil {
			return err
		}
		if t.Reason == "" {
			fmt.Fprintln(inv.stderr, `mpsctl: note: no --reason given; status shows "no reason given" until the resume (say why with --reason TEXT)`)
		}
		return WriteDrainResult(inv.stdout, res)
	}
}

// WriteDrainResult writes one line per instance a drain named, in the
// order of WriteStatus: "drained gpu 0 (GPU-1234abcd…) group a: state
// draining (2 leases running on)" for one it drained, "gpu 0 (…) group a:
// drained already by root at 2026-12-07T10:00:00Z: fan; state drained" for
// one that was. An mpsd that does not say which were drained before (no
// Already list) gets WriteAdminResult's lines.
func WriteDrainResult(w io.Writer, res api.AdminResult) error {
	if len(res.Instances) == 0 || len(res.Already) != len(res.Instances) {
		return WriteAdminResult(w, "drained", res)
	}
	var b bytes.Buffer
	for _, i := range instanceOrder(res.Instances) {
		in := res.Instances[i]
		where := fmt.Sprintf("gpu %s (%s) group %s", instanceGPUs(in), instanceUUIDs(in), cell(in.Group))
		if res.Already[i] {
			fmt.Fprintf(&b, "%s: drained already %s; state %s\n", where, drainRecord(in), cell(in.State))
			continue
		}
		fmt.Fprintf(&b, "drained %s: state %s\n", where, cell(in.State))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// drainRecord is "by root at 2026-12-07T10:00:00Z: fan replacement", as
// much of it as the status says.
func drainRecord(in api.InstanceStatus) string {
	var s []string
	if in.DrainedBy != "" {
		s = append(s, "by "+cell(in.DrainedBy))
	}
	if !in.DrainedAt.IsZero() {
		s = append(s, "at "+in.DrainedAt.UTC().Format(time.RFC3339))
	}
	r := strings.Join(s, " ")
	if in.DrainReason != "" {
		if r != "" {
			r += ": "
		}
		r += text(in.DrainReason, api.MaxReasonBytes)
	}
	return r
}

// instanceOrder is the order of WriteStatus (GPU, then group) over inst,
// as indexes.
func instanceOrder(inst []api.InstanceStatus) []int {
	order := make([]int, len(inst))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		a, b := inst[i], inst[j]
		return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.Group, b.Group))
	})
	return order
}

// cancelCommand is cancel LEASE...: each lease ends for good, one request
// each, in order; the first refusal stops it.
func cancelCommand(fs *flag.FlagSet) runFunc {
	var sig signalFlag
	fs.Var(&sig, "signal", "`SIG` is sent to the workload first (a name, TERM or SIGTERM, or a number); what is left after --grace is killed")
	grace := fs.Duration("grace", api.DefaultCancelGrace, "`D` is how long --signal's processes have to end before they are killed")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(args) == 0 {
			return usagef("missing LEASE")
		}
		for _, id := range args {
			if err := api.ValidLeaseID(id); err != nil {
				return usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": "))
			}
		}
		if *grace <= 0 || *grace > api.MaxCancelGrace {
			return usagef("--grace %s is out of range (above 0, at most %s)", *grace, api.MaxCancelGrace)
		}
		req := api.CancelRequest{Signal: int(sig.sig)}
		if sig.sig != 0 {
			req.GraceMs = grace.Milliseconds()
		}
		// The answer comes once the lease has ended: after the grace and
		// a kill.
		c := *inv.client().Client
		c.Timeout = c.Timeout + req.Grace()
		c.HeaderTimeout = c.Timeout
		for _, id := range args {
			req.Lease = id
			var res api.CancelResult
			if _, err := c.Post(ctx, api.PathCancel, req, &res); err != nil {
				return fmt.Errorf("cancel %s: %w", id, err)
			}
			if err := WriteCancelResult(inv.stdout, res, sig.sig); err != nil {
				return err
			}
		}
		return nil
	}
}

// WriteCancelResult writes cancel's line for one lease: "cancelled lease
// l-1 (was running; SIGTERM reached 2 processes, all ended within the
// grace)".
func WriteCancelResult(w io.Writer, res api.CancelResult, sig unix.Signal) error {
	what := "was " + cell(res.Was)
	if res.Was == api.LeaseRevoking {
		what = "was being revoked; it ends once its processes are gone, instead of being requeued"
	}
	if res.Was == api.LeaseRunning {
		switch {
		case sig != 0 && res.Signalled == 0:
			what += fmt.Sprintf("; %s reached no process of it, its processes were killed", unix.SignalName(sig))
		case sig != 0 && !res.Killed:
			what += fmt.Sprintf("; %s reached %d process(es), all ended within the grace", unix.SignalName(sig), res.Signalled)
		case sig != 0:
			what += fmt.Sprintf("; %s reached %d process(es), the rest were killed after the grace", unix.SignalName(sig), res.Signalled)
		default:
			what += "; its processes were killed"
		}
	}
	_, err := fmt.Fprintf(w, "cancelled lease %s (%s)\n", cell(res.Lease), what)
	return err
}

// signalFlag is cancel's --signal: a signal by name (TERM, SIGTERM,
// sigterm) or number (1-64).
type signalFlag struct{ sig unix.Signal }

func (s *signalFlag) String() string {
	if s == nil || s.sig == 0 {
		return ""
	}
	return unix.SignalName(s.sig)
}

func (s *signalFlag) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 1 || n > 64 {
			return errors.New("not a signal number (1-64)")
		}
		s.sig = unix.Signal(n)
		return nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return fmt.Errorf("unknown signal (try TERM, INT, HUP, USR1 or a number)")
	}
	s.sig = sig
	return nil
}
