package cgroup

import (
	"context"
	"os"
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
