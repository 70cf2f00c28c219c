package mps

// binaryVersionFormat is the line a 580 (CUDA 13.0) control daemon logs
// right after its start lines ("CUDA MPS Control binary version: 13000",
// seen on an H200); older daemons log none.
const binaryVersionFormat = "CUDA MPS Control binary version: %d"

// scanBinaryVersion reads the version of a control.log message that is
// exactly the binary version line; the version is positive.
func scanBinaryVersion(m string) (int, bool) {
	var v int
	if !scan1(m, binaryVersionFormat, &v) || v <= 0 {
		return 0, false
	}
	return v, true
}

// LoggedBinaryVersion is the "CUDA MPS Control binary version" that
// control.log claims in the daemon's name (13000: CUDA 13.0, from driver
// 580 on), or 0 when it holds none (older drivers) or the line is not read
// yet. Only the first such line counts. It is a hint, never a fact: anyone
// who can reach the log FIFO can write the line with the daemon's pid, and
// before 580, where the daemon logs none, theirs is the only one. Show and
// decide on the version NVML reports (the CUDA version of the driver the
// control binary ships with) instead.
func (d *Daemon) LoggedBinaryVersion() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.binaryVersion
}

// noteBinaryVersion keeps the first version line logged in the daemon's
// name.
func (d *Daemon) noteBinaryVersion(pid, v int) {
	if pid != d.pid {
		return
	}
	d.mu.Lock()
	if d.binaryVersion == 0 {
		d.binaryVersion = v
	}
	d.mu.Unlock()
}
