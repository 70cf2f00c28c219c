package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// Mode selects a backend.
type Mode int

const (
	// ModeAuto picks the backend from cgroups.Mode(), which inspects
	// /sys/fs/cgroup; set the mode explicitly for any other mount root.
	ModeAuto Mode = iota
	// ModeV2: the unified hierarchy does limits, membership, kill and
	// CLONE_INTO_CGROUP.
	ModeV2
	// ModeHybrid: v1 controllers (cpu, cpuacct, memory, pids) do limits and
	// stats; the unified tree does membership, kill and CLONE_INTO_CGROUP.
	ModeHybrid
	// ModeV1: v1 controllers do everything; the freezer tree is the
	// membership authority and kill freezes, signals and thaws.
	ModeV1
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeV2:
		return "v2"
	case ModeHybrid:
		return "hybrid"
	case ModeV1:
		return "v1"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults for Config.
const (
	DefaultRoot   = "/sys/fs/cgroup"
	DefaultParent = "mpsd"
)

// Config selects the backend and where the lease cgroups live.
type Config struct {
	// Mode defaults to ModeAuto.
	Mode Mode
	// Root is where the v1 controller hierarchies are mounted, one directory
	// per controller (Root/cpu, Root/memory, ...); default DefaultRoot.
	Root string
	// Unified is the cgroup2 mount; default Root in ModeV2 and Root/unified
	// in ModeHybrid. Unused in ModeV1.
	Unified string
	// Parent is the cgroup path, relative to every mount, under whose
	// Owner directory lease cgroups are made: DefaultParent, or a delegated subtree such as
	// system.slice/mpsd.service/leases. On v2 with limits, no ancestor of
	// the lease cgroups may hold processes (the kernel's no-internal-process
	// rule), so mpsd itself must not live in Parent or its group cgroups.
	Parent string
	// Owner names the manager's own directory under Parent: lease cgroups
	// are Parent/Owner/<group>/<lease>, and List, Open and Delete look
	// nowhere else, so managers of different owners sharing one Parent
	// never see (let alone kill) each other's leases. It must be one safe
	// path element. Empty puts leases straight under Parent
	// (Parent/<group>/<lease>), for a single user of Parent.
	Owner string
	// Logger receives debug lines; nil discards them (the package never
	// falls back to the global logger).
	Logger *slog.Logger
}

// Cgroups is the Manager over real cgroupfs.
type Cgroups struct {
	mode   Mode
	parent string  // the configured parent
	owner  string  // Config.Owner; "" when leases sit straight under parent
	base   string  // parent/owner: where this manager's leases live
	v1     *v1Tree // nil in ModeV2
	v2     *v2Tree // nil in ModeV1
	log    *slog.Logger
	// cloneInto: Start may clone children straight into the unified tree
	// (CLONE_INTO_CGROUP, Linux 5.7). Without it Start attaches the child
	// while it is stopped after its execve, as on v1.
	cloneInto bool

	// mu keeps Create from racing with Delete's removal of an emptied
	// group directory.
	mu sync.Mutex
}

var _ Manager = (*Cgroups)(nil)

// New checks that the hierarchies the mode needs are mounted and returns a
// Manager over them. It creates nothing until Create.
func New(cfg Config) (*Cgroups, error) {
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.Parent == "" {
		cfg.Parent = DefaultParent
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validParent(cfg.Parent); err != nil {
		return nil, err
	}
	if cfg.Owner != "" && !validName(cfg.Owner) {
		return nil, fmt.Errorf("%w: owner %q", ErrInvalidName, cfg.Owner)
	}
	mode := cfg.Mode
	if mode == ModeAuto {
		switch cgroups.Mode() {
		case cgroups.Unified:
			mode = ModeV2
		case cgroups.Hybrid:
			mode = ModeHybrid
		case cgroups.Legacy:
			mode = ModeV1
		default:
			return nil, fmt.Errorf("%w: nothing mounted at %s", ErrUnavailable, DefaultRoot)
		}
	}
	if cfg.Unified == "" {
		cfg.Unified = cfg.Root
		if mode == ModeHybrid {
			cfg.Unified = filepath.Join(cfg.Root, "unified")
		}
	}
	m := &Cgroups{mode: mode, parent: cfg.Parent, owner: cfg.Owner, base: path.Join(cfg.Parent, cfg.Owner)}
	switch mode {
	case ModeV2:
		m.v2 = &v2Tree{mount: cfg.Unified}
	case ModeHybrid:
		m.v2 = &v2Tree{mount: cfg.Unified}
		m.v1 = newV1Tree(cfg.Root, false)
	case ModeV1:
		m.v1 = newV1Tree(cfg.Root, true)
	default:
		return nil, fmt.Errorf("%w: unknown mode %s", ErrUnavailable, mode)
	}
	if m.v2 != nil {
		if err := m.v2.check(); err != nil {
			return nil, err
		}
	}
	if m.v1 != nil {
		if err := m.v1.check(); err != nil {
			return nil, err
		}
	}
	if m.v2 != nil {
		m.cloneInto = kernelHasCloneIntoCgroup()
	}
	m.log = cfg.Logger.With("cgroup_mode", mode.String(), "cgroup_parent", cfg.Parent, "cgroup_owner", cfg.Owner)
	return m, nil
}

// Mode reports the backend in use.
func (m *Cgroups) Mode() Mode { return m.mode }

// MembershipMount is the mount whose cgroup.procs files say which
// processes a cgroup holds, where List looks for lease cgroups: the
// unified hierarchy in ModeV2 and ModeHybrid, the v1 freezer hierarchy in
// ModeV1. A lease cgroup Path is relative to it.
func (m *Cgroups) MembershipMount() string { return m.memberDir("") }

func (m *Cgroups) rel(id LeaseID) string {
	return filepath.Join(m.base, id.Group, id.Lease)
}

// memberDir is the directory whose cgroup.procs says which processes belong
// to a cgroup path: the unified tree where there is one, else v1 freezer.
func (m *Cgroups) memberDir(rel string) string {
	if m.v2 != nil {
		return m.v2.dir(rel)
	}
	return m.v1.dir(cgroup1.Freezer, rel)
}

// dirs lists every directory that makes up one cgroup path, with the name
// of its hierarchy for error messages, membership directory first.
func (m *Cgroups) dirs(rel string) []namedDir {
	var out []namedDir
	if m.v2 != nil {
		out = append(out, namedDir{"unified", m.v2.dir(rel)})
	}
	if m.v1 != nil {
		if m.v1.freezer {
			out = append(out, namedDir{string(cgroup1.Freezer), m.v1.dir(cgroup1.Freezer, rel)})
		}
		for _, c := range m.v1.limitCtrls() {
			out = append(out, namedDir{string(c), m.v1.dir(c, rel)})
		}
	}
	return out
}

type namedDir struct{ hierarchy, path string }

// Hierarchies maps every hierarchy a lease cgroup is made of ("unified",
// or the v1 controller) to its mount: what a check for leftovers must look
// at on this host's layout.
func (m *Cgroups) Hierarchies() map[string]string {
	out := map[string]string{}
	for _, d := range m.dirs("") {
		out[d.hierarchy] = d.path
	}
	return out
}

// Create implements Manager.
func (m *Cgroups) Create(id LeaseID, lim Limits) (Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rel := m.rel(id)
	member := m.memberDir(rel)
	switch _, err := os.Lstat(member); {
	case err == nil:
		return nil, fmt.Errorf("cgroup: create %s: %w", member, ErrExist)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("cgroup: create %s: %w", member, err)
	}
	l := &lease{m: m, id: id, rel: rel}
	if err := m.create(rel, lim); err != nil {
		if rerr := l.remove(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	m.log.Debug("lease cgroup created", "lease", id.String(), "limits", fmt.Sprintf("%+v", lim))
	return l, nil
}

func (m *Cgroups) create(rel string, lim Limits) error {
	if lim == (Limits{}) {
		// Nothing to write: the cgroup is its directories, one mkdir in
		// each hierarchy (what the library would do, less its walk up
		// the path and its writes of nothing). Its group directory
		// missing, it goes the library's way, which makes parents.
		if done, err := m.mkdirs(rel); done {
			return err
		}
	}
	if m.v2 != nil {
		res := &cgroup2.Resources{}
		if m.v1 == nil {
			res = v2Resources(lim)
			if err := m.v2.checkControllers(rel, res.EnabledControllers()); err != nil {
				return err
			}
		}
		if _, err := cgroup2.NewManager(m.v2.mount, "/"+rel, res); err != nil {
			return fmt.Errorf("cgroup: unified: create %s: %w", m.v2.dir(rel), err)
		}
	}
	if m.v1 != nil {
		return m.v1.create(rel, lim)
	}
	return nil
}

// mkdirs makes rel in every hierarchy, membership first, with one mkdir
// each, and its group directory with one more where that is missing (it
// goes with its group's last lease, so the first lease after a quiet
// spell makes it again); done is false when the group directory's own
// parent is missing in a hierarchy (what was made before it stays, and
// the library's way, which makes parents, takes it as it takes any
// directory already there). A directory already there is taken, as
// MkdirAll takes it (cpu and cpuacct are one directory where they share
// a hierarchy; Create has checked that the membership one is new).
func (m *Cgroups) mkdirs(rel string) (done bool, err error) {
	for _, d := range m.dirs(rel) {
		err := unix.Mkdir(d.path, 0o755)
		if errors.Is(err, unix.ENOENT) {
			if gerr := unix.Mkdir(filepath.Dir(d.path), 0o755); gerr == nil || errors.Is(gerr, unix.EEXIST) {
				err = unix.Mkdir(d.path, 0o755)
			}
		}
		switch {
		case err == nil, errors.Is(err, unix.EEXIST):
		case errors.Is(err, unix.ENOENT):
			return false, nil
		default:
			return true, fmt.Errorf("cgroup: %s: create %s: %w", d.hierarchy, d.path, err)
		}
	}
	return true, nil
}

// Open implements Manager.
func (m *Cgroups) Open(id LeaseID) (Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	rel := m.rel(id)
	member := m.memberDir(rel)
	_, err := os.Lstat(member)
	if errors.Is(err, fs.ErrNotExist) && m.owner != "" {
		// A lease made before owners existed sits straight under the
		// parent. The caller opens only leases it has recorded as its
		// own, so that one is too.
		legacy := filepath.Join(m.parent, id.Group, id.Lease)
		if _, lerr := os.Lstat(m.memberDir(legacy)); lerr == nil {
			return &lease{m: m, id: id, rel: legacy}, nil
		}
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cgroup: open %s: %w", member, ErrNotExist)
		}
		return nil, fmt.Errorf("cgroup: open %s: %w", member, err)
	}
	return &lease{m: m, id: id, rel: rel}, nil
}

// List implements Manager. It reads the membership hierarchy only: a lease
// that exists there is listed even if a v1 limit directory is missing, so
// it can still be killed and deleted. Directories whose names this package
// would not have made are skipped, and so is everything outside the
// owner's directory.
func (m *Cgroups) List() ([]LeaseID, error) {
	root := m.memberDir(m.base)
	groups, err := subdirs(root)
	if err != nil {
		return nil, fmt.Errorf("cgroup: list %s: %w", root, err)
	}
	var ids []LeaseID
	for _, g := range groups {
		leases, err := subdirs(filepath.Join(root, g))
		if err != nil {
			return nil, fmt.Errorf("cgroup: list %s: %w", filepath.Join(root, g), err)
		}
		for _, l := range leases {
			ids = append(ids, LeaseID{Group: g, Lease: l})
		}
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].Group != ids[j].Group {
			return ids[i].Group < ids[j].Group
		}
		return ids[i].Lease < ids[j].Lease
	})
	return ids, nil
}

// Unowned implements Manager: with an Owner, every cgroup directly under
// the parent but the owner's own directory; without one, nothing.
func (m *Cgroups) Unowned() ([]string, error) {
	if m.owner == "" {
		return nil, nil
	}
	root := m.memberDir(m.parent)
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: list %s: %w", root, err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != m.owner && !strings.HasPrefix(e.Name(), probePrefix) {
			out = append(out, path.Join(m.parent, e.Name()))
		}
	}
	return out, nil
}

// subdirs lists the valid-named subdirectories of dir; a missing dir has
// none.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && validName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// removeTree removes a cgroup directory and any cgroups nested in it,
// deepest first (cgroupfs rmdir ignores the interface files but not child
// cgroups). A missing directory is not an error.
func removeTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// probePrefix starts the name of the cgroup CheckCreate makes and removes.
// No lease or group name starts with a dot (validName), so List never
// sees one, and Unowned leaves it out.
const probePrefix = ".mpsd-probe-"

// CheckCreate makes one cgroup under the parent in every hierarchy a
// lease uses, the way Create makes a lease's, and removes it again: what
// mpsd does with its cgroups works as its user, or an error tells why
// not before any lease needs one. The parent is made if missing and
// stays, as it does after a lease's Delete. The error wraps the OS error
// (errors.Is(err, fs.ErrPermission) for a user that may not) and names
// the directory that failed.
func (m *Cgroups) CheckCreate() error {
	rel := path.Join(m.parent, fmt.Sprintf("%s%d", probePrefix, os.Getpid()))
	m.mu.Lock()
	defer m.mu.Unlock()
	l := &lease{m: m, rel: rel}
	// One a killed mpsd of this pid left is gone first. The probe holds
	// nothing: one rmdir in each hierarchy removes it, as Delete removes
	// an empty lease, and only what that leaves (a tree someone made in
	// it) is walked.
	_ = l.removeEmpty()
	err := m.create(rel, Limits{})
	if rerr := l.removeEmpty(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// ParentDir is the directory of the configured parent in the membership
// hierarchy (MembershipMount), for messages.
func (m *Cgroups) ParentDir() string { return m.memberDir(m.parent) }
