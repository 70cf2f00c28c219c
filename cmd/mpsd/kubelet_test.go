package main

import (
	"errors"
	"log/slog"
	"testing"
)

// Only with the device plugin on, and then only for the groups it serves
// (every group without --kubelet-groups), do daemons get a private
// /dev/shm: clients of the other groups may be on the host.
func TestKubeletPrivateShmGroups(t *testing.T) {
	if f := (kubeletFlags{}).privateShm(nil); f != nil {
		t.Errorf("without --kubelet-device-plugin: a private /dev/shm for some groups")
	}
	all := kubeletFlags{enabled: true}.privateShm(nil)
	some := kubeletFlags{enabled: true}.privateShm([]string{"a"})
	for _, tc := range []struct {
		group     string
		all, some bool
	}{{"a", true, true}, {"b", true, false}} {
		if all(tc.group) != tc.all || some(tc.group) != tc.some {
			t.Errorf("group %s: every group served %v, only a served %v; want %v, %v", tc.group, all(tc.group), some(tc.group), tc.all, tc.some)
		}
	}
}

// --kubelet-dra-capacity: consumable and whole as given, auto by the API
// server's version (consumable capacity from 1.36), consumable when the
// version cannot be read, anything else refused.
func TestDRAMode(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name, capacity string
		major, minor   string
		err            error
		want           string
		bad            bool
	}{
		{"consumable", capacityConsumable, "1", "30", nil, capacityConsumable, false},
		{"whole", capacityWhole, "1", "37", nil, capacityWhole, false},
		{"auto, 1.37", capacityAuto, "1", "37", nil, capacityConsumable, false},
		{"auto, 1.36+", capacityAuto, "1", "36+", nil, capacityConsumable, false},
		{"auto, 1.35", capacityAuto, "1", "35", nil, capacityWhole, false},
		{"auto, no version", capacityAuto, "", "", nil, capacityConsumable, false},
		{"auto, discovery fails", capacityAuto, "", "", errors.New("forbidden"), capacityConsumable, false},
		{"bad", "counted", "1", "37", nil, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := draMode(tc.capacity, func() (string, string, string, error) {
				return tc.major, tc.minor, "v" + tc.major + "." + tc.minor, tc.err
			}, log)
			if (err != nil) != tc.bad || got != tc.want {
				t.Errorf("draMode(%q) on %s.%s = %q, %v; want %q (error %v)", tc.capacity, tc.major, tc.minor, got, err, tc.want, tc.bad)
			}
		})
	}
}

// With --kubelet-dra, the groups it offers get a private /dev/shm too.
func TestDRAPrivateShm(t *testing.T) {
	f := kubeletFlags{dra: draFlags{enabled: true}}.privateShm([]string{"a"})
	if f == nil || !f("a") || f("b") {
		t.Errorf("--kubelet-dra --kubelet-groups a: a private /dev/shm for a only wanted")
	}
}
