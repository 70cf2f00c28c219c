package mpsctl

import (
	"testing"

	"github.com/mpsd/mpsd/api"
)

// NOTE names a server that clients of no lease hold: on a daemon without
// multiuser with its uid (MPS makes other users wait), on a shared one by
// their count only; a server whose clients are all leased is not noted.
func TestInstanceNoteServers(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   api.InstanceStatus
		want string
	}{
		{"leased only", api.InstanceStatus{Servers: []api.ServerStatus{{PID: 7, UID: 1000, LeasedClients: 3}}}, none},
		{"held", api.InstanceStatus{Servers: []api.ServerStatus{{PID: 7, UID: 1000, LeasedClients: 1, UnleasedClients: 2}}},
			"server 7 of uid 1000 held by clients of no lease (2): other users wait"},
		{"pending", api.InstanceStatus{Servers: []api.ServerStatus{{PID: 7, UID: 1000, UnleasedClients: 1, PendingLeases: []string{"l-2", "l-3"}}}},
			"server 7 of uid 1000: leases l-2,l-3 wait behind it inside MPS; server 7 of uid 1000 held by clients of no lease (1): other users wait"},
		{"multiuser", api.InstanceStatus{Multiuser: true, Servers: []api.ServerStatus{{PID: 9, UID: 0, UnleasedClients: 1}}},
			"multiuser; server 9: clients of no lease (1)"},
		{"fault", api.InstanceStatus{Servers: []api.ServerStatus{{PID: 7, UID: 1000, UnleasedClients: 2, Fault: true}}},
			"server 7 in FAULT: new clients are refused until the clients of no lease of its fault have gone; server 7 of uid 1000 held by clients of no lease (2): other users wait"},
	} {
		if got := instanceNote(tc.in); got != tc.want {
			t.Errorf("%s: note %q; want %q", tc.name, got, tc.want)
		}
	}
}
