package policy

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Parse reads a config (YAML, version 1) through a fresh viper, strictly:
// every unknown key, bad value, missing required key and inconsistency is
// reported, each with its key path, in one *ConfigError (matching
// ErrInvalidConfig). When h.GPUs is not nil the config is also checked
// against the host's GPUs and Group.Instances is filled; when h.Driver
// is set, against what that driver's MPS can run; user and group
// names are resolved through h.Users (SystemUsers when nil) into
// Config.Access. Other errors come from reading r.
func Parse(r io.Reader, h Host) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read config: %w", err)
	}
	return parseBytes(data, h)
}

func parseBytes(data []byte, h Host) (*Config, error) {
	d := newDecoder()
	raw, ok := d.readYAML(data)
	if !ok {
		return nil, d.err()
	}
	cfg := d.decode(raw)
	d.validate(cfg)
	if h.GPUs != nil {
		d.validateHost(cfg, h.GPUs)
	}
	d.validateDriver(cfg, h.Driver)
	users := h.Users
	if users == nil {
		users = SystemUsers{}
	}
	cfg.Access = d.resolveAccess(cfg, users)
	if err := d.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// LoadFile reads and parses the config file at path (see Parse). A
// *ConfigError carries the path.
func LoadFile(path string, h Host) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := parseBytes(data, h)
	if err != nil {
		return nil, withPath(err, path)
	}
	return cfg, nil
}

// withPath names the file in a *ConfigError.
func withPath(err error, path string) error {
	if ce := (*ConfigError)(nil); errors.As(err, &ce) {
		ce.Path = path
	}
	return err
}

// CheckFile is `mpsctl check-config FILE`: nil when the file would be
// accepted on this host, else every problem (see Parse).
func CheckFile(path string, h Host) error {
	_, err := LoadFile(path, h)
	return err
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: open config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read config %s: %w", path, err)
	}
	return data, nil
}
