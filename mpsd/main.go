package mpsd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// DefaultConfigPath is where mpsd reads its config without --config.
const DefaultConfigPath = "/etc/mpsd/mpsd.yaml"

// Main is the mpsd command: flags, logger, New, Run. It returns the exit
// status: 0 after a clean stop (ctx done), 2 for bad usage, 1 otherwise.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("mpsd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", DefaultConfigPath, "config file (YAML, version 1)")
	simulate := fs.Bool("simulate", false, "run on simulated GPUs with the MPS emulator (the config's simulate section)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "text", "log format: text or json")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "usage: mpsd [--config FILE] [--simulate] [--log-level LEVEL] [--log-format text|json]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "mpsd: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		_, _ = fmt.Fprintf(stderr, "mpsd: --log-level %q: want debug, info, warn or error\n", *level)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch *format {
	case "text":
		h = slog.NewTextHandler(stderr, hopts)
	case "json":
		h = slog.NewJSONHandler(stderr, hopts)
	default:
		_, _ = fmt.Fprintf(stderr, "mpsd: --log-format %q: want text or json\n", *format)
		return 2
	}
	log := slog.New(h)
	d, err := New(Options{ConfigPath: *configPath, Simulate: *simulate, Logger: log})
	if err != nil {
		log.Error("mpsd cannot start", "err", err)
		return 1
	}
	if err := d.Run(ctx); err != nil {
		log.Error("mpsd failed", "err", err)
		return 1
	}
	return 0
}
