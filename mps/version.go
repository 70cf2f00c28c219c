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

// BinaryVersion is the "CUDA MPS Control binary version" the daemon
// logged at its start (13000: CUDA 13.0, from driver 580 on), or 0 when
// it logged none (older drivers) or the line is not read yet. Only the
// first such line in the daemon's own name counts; anyone who can reach
// the log FIFO could write one, so it is for display, never to decide
// anything on.
func (d *Daemon) BinaryVersion() int {
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
