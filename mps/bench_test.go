package mps

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// eachBackendB runs a benchmark against every backend.
func eachBackendB(b *testing.B, fn func(b *testing.B, be backend)) {
	for _, gen := range emutest.Generations {
		b.Run("real-"+gen, func(b *testing.B) { fn(b, realBackend(b, gen)) })
	}
	for _, gen := range emutest.Generations {
		b.Run("emu-"+gen, func(b *testing.B) { fn(b, emuBackend(b, gen)) })
	}
}

// BenchmarkCommand compares a command through this package with the bare
// `echo CMD | nvidia-cuda-mps-control` (the same exec without the package,
// and through a shell) against the same daemon in the same run.
func BenchmarkCommand(b *testing.B) {
	eachBackendB(b, func(b *testing.B, be backend) {
		in := start(b, newConfig(b, be))
		ctx := context.Background()
		b.Run("package", func(b *testing.B) {
			for b.Loop() {
				if _, err := in.d.ServerList(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("bare-exec", func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(in.d.cfg.ControlPath)
				cmd.Env = in.d.clientEnv
				cmd.Stdin = strings.NewReader("get_server_list\n")
				var out bytes.Buffer
				cmd.Stdout = &out
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("bare-shell", func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command("/bin/sh", "-c", "echo get_server_list | \"$0\"", in.d.cfg.ControlPath)
				cmd.Env = in.d.clientEnv
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkKillToEvent measures SIGKILL of a server to its ServerExited event.
func BenchmarkKillToEvent(b *testing.B) {
	eachBackendB(b, func(b *testing.B, be backend) {
		in := start(b, newConfig(b, be))
		var lat []time.Duration
		for b.Loop() {
			b.StopTimer()
			pid := in.startServer(b)
			b.StartTimer()
			begin := time.Now()
			sigkill(b, pid)
			in.waitEvent(quietTB{b}, "server exited", kindPID(ServerExited, pid))
			lat = append(lat, time.Since(begin))
			b.StopTimer()
			in.waitServerGone(b, pid)
			b.StartTimer()
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	})
}

// quietTB drops per-event logs inside the timed section.
type quietTB struct{ testing.TB }

func (quietTB) Logf(string, ...any) {}
