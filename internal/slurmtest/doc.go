// Package slurmtest holds the tests of mpsd's Slurm integration: the
// examples/slurm prolog and epilog against a live and a dead mpsd, and an
// end-to-end test that runs a real single-node Slurm (Debian's slurmctld,
// slurmd and munged, started on localhost in a temporary directory and
// stopped after) whose jobs run `mps-launch ... mpsemu-client` through
// srun and sbatch against mpsd --simulate.
//
// What the Slurm test emulates, and what is real: Slurm, munge, the job
// environments, gres/mps and gres/gpu allocation, RequeueExit, the prolog
// and the epilog are real; the GPUs are mpsd's simulated ones and MPS is
// the emulator. gres.conf names two device files that are symlinks to
// /dev/null, because slurmd wants character devices and jobs never open
// them. Jobs run as root, the test's user.
//
// The tests need Slurm's programs (apt-get install slurmctld slurmd munge
// slurm-client) and root; without them they skip and say why, unless
// MPSD_REQUIRE_SLURM=1 (CI sets it after installing them) makes that a
// failure. The package has no code besides its tests: it runs external
// programs, which only the packages docs/architecture.md#packages names
// may do outside tests.
package slurmtest
