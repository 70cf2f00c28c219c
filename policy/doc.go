// Package policy owns the configuration (schema version 1, strict decoding,
// validation, hot reload, diffs) and the pure admission decisions: who may
// use which group, whether a request can ever fit or fits now, where it is
// placed, and which queued request goes next.
//
// # Configuration
//
// Parse reads YAML from an io.Reader through a fresh viper and decodes it
// against one table of keys and defaults (schema.go; each default is also
// stated on its Config field). It is strict: an unknown key, a value of the
// wrong kind, a missing required key or an inconsistent combination is a
// Problem with its key path (`groups.inference.memroy: unknown key (did you
// mean groups.inference.memory?)`), and every problem of a file is returned
// at once in a *ConfigError, which matches ErrInvalidConfig. Given the
// host's GPUs (Host.GPUs), Parse also checks GPU selectors and that the
// memory budgets of the groups sharing a GPU fit its memory, and records each
// group's instance GPU sets. User and group names are resolved through an
// injected Users (os/user in production) into Config.Access. CheckFile is
// `mpsctl check-config FILE`.
//
// Keys are case-insensitive, as viper folds them to lower case; so are group
// names, which must be lower-case path-safe names. Sizes are binary and
// read by internal/units (`8G`, `8GiB`, `512M`); durations are Go durations
// (`2s`, `500ms`). A second YAML document in the file is an error, not
// silently ignored.
//
// A Watcher keeps the config in force behind an atomic pointer and applies
// edits: it watches the file's directory with fsnotify (viper.WatchConfig
// races, swallows errors and loses the file on delete-and-recreate),
// debounces, parses and validates the whole file, then swaps. A bad or
// half-written file is reported to a callback and the last good config
// stays. Diff lists what changed per group so mpsd can apply only that.
//
// # Decisions
//
// Group.NewRequest validates and completes a client's demand. Access
// answers who is an admin and which groups a caller may use. Place picks
// an instance for a request (binpack or spread), telling "can never fit"
// (ErrNeverFits) from "does not fit now" (ErrNoRoomNow); Next applies it to
// the head of a group's queue in QueueOrder (priority, then requeued, then
// arrival). They work on plain values (Instance, Request, GPU) that mpsd
// copies from its own state, allocate nothing, and do no I/O.
//
// The package never starts processes, touches MPS, cgroups or NVML, and
// never logs: it imports no other package of the project but
// internal/units, and reports outcomes as values and errors for mpsd to
// act on and log.
package policy
