package launcher

import (
	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// newClient is mps-launch's client of mpsd at socket: package client's,
// whose unreachable errors end with what the user may do about them.
func newClient(socket string) *client.Client {
	c := client.New(socket)
	c.Hint = " (is mpsd running? --socket or $" + api.EnvSocket + " names another socket)"
	return c
}
