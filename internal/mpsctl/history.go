package mpsctl

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// historyCommand is mpsctl history: the ended leases mpsd recorded.
func historyCommand(fs *flag.FlagSet) runFunc {
	since := fs.String("since", "", "`D` shows leases that ended in the last D (a duration: 2h, 30m) or since D (an RFC 3339 time)")
	user := fs.String("user", "", "`U` shows the leases of user U (a name or a uid)")
	group := fs.String("group", "", "`G` shows the leases of group G")
	asJSON := fs.Bool("json", false, "print the history document as mpsd sent it (indented JSON)")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		// A name is asked by its uid: mpsd matches uids, and a record's
		// name may be empty (a lease restored at mpsd's start, a uid its
		// name cache did not hold). A name this host does not know is
		// sent as it is, for the records that carry it.
		who := *user
		if uid, err := inv.lookupUID(who); who != "" && err == nil {
			who = strconv.FormatUint(uint64(uid), 10)
		}
		q, err := historyQuery(*since, who, *group, time.Now())
		if err != nil {
			return err
		}
		var h api.History
		raw, err := inv.client().Get(ctx, q.Path(), &h)
		if err != nil {
			return err
		}
		if *asJSON {
			return WriteHistoryJSON(inv.stdout, raw)
		}
		return WriteHistory(inv.stdout, h, inv.names())
	}
}

// historyQuery is the query of mpsctl history's flags at now: since a
// duration ago ("2h") or an RFC 3339 time; user and group as given (mpsd
// checks them as it checks every query).
func historyQuery(since, user, group string, now time.Time) (api.HistoryQuery, error) {
	q := api.HistoryQuery{User: user, Group: group}
	if since != "" {
		if d, err := time.ParseDuration(since); err == nil {
			if d < 0 {
				return q, usagef("--since %s: a duration ago is not negative", since)
			}
			q.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, since); err == nil {
			q.Since = t
		} else {
			return q, usagef("--since %q: want a duration (2h, 30m) or an RFC 3339 time (2026-01-02T15:04:05Z)", since)
		}
	}
	// What mpsd would refuse, refused here with the flag's name.
	if _, err := api.ParseHistoryQuery(q.Values().Encode()); err != nil {
		return q, usagef("%s", strings.TrimPrefix(err.Error(), api.ErrInvalid.Error()+": history query: "))
	}
	return q, nil
}

// WriteHistory renders the ended leases for people, oldest first: one
// line each, under a header; a line says when older ones were left out,
// and a non-admin is told they see their own.
func WriteHistory(w io.Writer, h api.History, names Names) error {
	var b bytes.Buffer
	switch {
	case len(h.Records) == 0 && h.OwnOnly:
		b.WriteString("no ended leases of yours\n")
	case len(h.Records) == 0:
		b.WriteString("no ended leases\n")
	default:
		tw := newTable(&b)
		fmt.Fprintln(tw, "LEASE\tJOB\tUSER\tGROUP\tGPU\tSM\tMEM\tPEAK\tSTART\tEND\tWAIT\tRAN\tTRIES\tENDED\tEXIT\tREASON")
		for _, r := range h.Records {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d%%\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
				cell(r.Lease), cell(r.JobID), cell(recordUser(r, names)), cell(r.Group), ints(r.GPUIndexes), r.SM,
				memText(&r.MemBytes), memText(r.PeakMemBytes), r.Start.Format(time.RFC3339), r.End.Format(time.RFC3339),
				waitText(r.WaitMillis), ranText(r), r.Attempts, cell(r.Ended), exitText(r), text(r.Reason, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if h.Truncated {
			fmt.Fprintf(&b, "(the newest %d shown; narrow with --since, --user or --group)\n", len(h.Records))
		}
		if h.OwnOnly {
			b.WriteString("(your leases only: an admin sees every user's)\n")
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteHistoryJSON writes the history document raw as mpsd sent it,
// indented as WriteStatusJSON does.
func WriteHistoryJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(raw), "", "  "); err != nil {
		return fmt.Errorf("%w: history document: %v", ErrBadAnswer, err)
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// recordUser is the record's user name as mpsd knew it, else as this
// host resolves its uid, else the uid.
func recordUser(r api.HistoryRecord, names Names) string {
	if r.User != "" {
		return r.User
	}
	if n := names(r.UID); n != "" {
		return n
	}
	return strconv.FormatUint(uint64(r.UID), 10)
}

// memText is a size in bytes; "-" when unknown.
func memText(v *uint64) string {
	if v == nil || *v > math.MaxInt64 {
		return none
	}
	return units.FormatSize(int64(*v))
}

// waitText is a wait in milliseconds as a duration.
func waitText(ms int64) string {
	return since(time.UnixMilli(ms), time.UnixMilli(0))
}

// ranText is how long the last run lasted, from its grant to the end;
// "-" for a lease that never ran.
func ranText(r api.HistoryRecord) string {
	if r.Granted == nil {
		return none
	}
	return since(r.End, *r.Granted)
}

// exitText is the command's exit status, with the signal that killed it;
// "-" when unknown.
func exitText(r api.HistoryRecord) string {
	switch {
	case r.ExitStatus == nil:
		return none
	case r.Signal != "":
		return fmt.Sprintf("%d(%s)", *r.ExitStatus, cell(r.Signal))
	}
	return strconv.Itoa(*r.ExitStatus)
}
