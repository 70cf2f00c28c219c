package dra

import (
	"log/slog"
	"slices"

	mpsdpolicy "github.com/mpsd/mpsd/policy"
)

// LoadLimits reads the lease limits of the groups offered (every group
// where offered is empty) from mpsd's config file at path, for the
// devices' requestPolicy: read once at start (a reload that changes them
// is published at mpsd's next start). A config that does not load is an
// error: without it the devices would publish no group maximum. A group
// offered that is not multiuser is logged.
func LoadLimits(path string, offered []string, log *slog.Logger) (map[string]Limits, error) {
	cfg, err := mpsdpolicy.LoadFile(path, mpsdpolicy.Host{})
	if err != nil {
		return nil, errf("group limits: %w", err)
	}
	out := map[string]Limits{}
	var names []string
	for _, g := range cfg.Groups {
		if len(offered) > 0 && !slices.Contains(offered, g.Name) {
			continue
		}
		names = append(names, g.Name)
		out[g.Name] = Limits{MaxSM: g.MaxSM, DefaultSM: g.DefaultSM, MaxMem: g.MaxMem, DefaultMem: g.DefaultMem}
		if !g.Multiuser {
			log.Warn("group offered to DRA is not multiuser: pods run as any uid, and this group serves one uid at a time per instance, so pods of other users wait; set multiuser: true, or leave the group out with --kubelet-groups", "group", g.Name)
		}
	}
	if err := checkGroupNames(names); err != nil {
		return nil, err
	}
	return out, nil
}

// checkGroupNames refuses two groups whose devices would have the same
// name (DeviceName writes '_' as '-'): the second's devices would not
// be published and its claims would go to the first's instances.
func checkGroupNames(groups []string) error {
	seen := map[string]string{}
	for _, g := range groups {
		dev := DeviceName(g, 0)
		if o, ok := seen[dev]; ok && o != g {
			return errf("groups %s and %s have the same device names (%s): a device name writes '_' as '-'; rename one, or leave one out with --kubelet-groups", o, g, dev)
		}
		seen[dev] = g
	}
	return nil
}
