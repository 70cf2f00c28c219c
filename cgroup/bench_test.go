package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// BenchmarkKill100 measures Kill of a lease holding 100 processes (a shell
// and 99 sleeps) until the lease is empty. Only Kill is timed. Target: at
// most 50ms per kill.
func BenchmarkKill100(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			if os.Geteuid() != 0 {
				b.Skip("needs root: creates cgroups in the host's cgroupfs")
			}
			if be.skip != "" {
				b.Skip(be.skip)
			}
			m := newManager(b, be)
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				l := mustCreate(b, m, LeaseID{"bench", "l"}, Limits{})
				p := startIn(b, l.Start, `exec 3>&1 >/dev/null 2>&1
i=1; while [ $i -lt 100 ]; do sleep 1000 & i=$((i+1)); done
echo ready >&3; exec 3>&-; wait`)
				p.readLine(b, 30*time.Second)
				if pids, err := l.Pids(); err != nil || len(pids) != 100 {
					b.Fatalf("lease has %d processes (%v), want 100", len(pids), err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), killDeadline)
				b.StartTimer()
				err := l.Kill(ctx)
				b.StopTimer()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				_ = p.wait()
				if err := l.Delete(); err != nil {
					b.Fatal(err)
				}
				reapOrphans()
			}
		})
	}
}

// BenchmarkAttach measures Attach, moving one waiting process between two
// lease cgroups, after an idle gap since the previous move: back to back,
// a move costs microseconds; after a gap the kernel's first migration
// waits for an RCU grace period (cgroup_threadgroup_rwsem, taken for
// writing on every hierarchy's cgroup.procs), which a launch pays on its
// critical path when launches are not back to back.
func BenchmarkAttach(b *testing.B) {
	for _, be := range backends() {
		for _, gap := range []time.Duration{0, 100 * time.Millisecond} {
			b.Run(fmt.Sprintf("%s/gap=%s", be.name, gap), func(b *testing.B) {
				if os.Geteuid() != 0 {
					b.Skip("needs root: creates cgroups in the host's cgroupfs")
				}
				if be.skip != "" {
					b.Skip(be.skip)
				}
				m := newManager(b, be)
				ls := []Lease{mustCreate(b, m, LeaseID{"bench", "a"}, Limits{}), mustCreate(b, m, LeaseID{"bench", "b"}, Limits{})}
				cmd := exec.Command("/bin/sleep", "3600")
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); reapOrphans() }()
				// ns/op includes the gap; the attach-* metrics are the moves.
				var took []time.Duration
				for i := 0; b.Loop(); i++ {
					time.Sleep(gap)
					t0 := time.Now()
					err := ls[i%2].Attach(cmd.Process.Pid)
					took = append(took, time.Since(t0))
					if err != nil {
						b.Fatal(err)
					}
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2])/1e6, "attach-p50-ms")
				b.ReportMetric(float64(took[len(took)*99/100])/1e6, "attach-p99-ms")
			})
		}
	}
}
