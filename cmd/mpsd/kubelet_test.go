package main

import "testing"

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
