package mpsd

import (
	"os/user"
	"strconv"
	"sync"
)

// maxUserNames bounds the cache of user names: one entry per uid that
// asked for a lease, so a host's users fit; beyond it names are looked up
// for each request.
const maxUserNames = 4096

// userNames resolves uids to user names for the log lines of leases. A
// lookup reads the user database (a file, or NSS), so it is done before
// Daemon.mu is taken, and what it found is kept: under the lock only the
// cache is read.
type userNames struct {
	mu    sync.Mutex
	names map[uint32]string
}

// resolve looks uid up (outside Daemon.mu) and remembers the name; ""
// when the database has none.
func (u *userNames) resolve(uid uint32) string {
	u.mu.Lock()
	name, ok := u.names[uid]
	u.mu.Unlock()
	if ok {
		return name
	}
	if usr, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		name = usr.Username
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.names == nil {
		u.names = map[uint32]string{}
	}
	if len(u.names) < maxUserNames {
		u.names[uid] = name
	}
	return name
}

// who names uid for an operator's record or a launcher's line: "alice
// (uid 1001)", or "uid 1001" when the database has no name for it; short
// gives the name alone when there is one. It looks the name up (outside
// Daemon.mu).
func (u *userNames) who(uid uint32, short bool) string {
	id := "uid " + strconv.FormatUint(uint64(uid), 10)
	switch name := u.resolve(uid); {
	case name == "":
		return id
	case short:
		return name
	default:
		return name + " (" + id + ")"
	}
}

// cached is the name resolve found for uid, without looking it up.
func (u *userNames) cached(uid uint32) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.names[uid]
}
