#!/usr/bin/env bash
# Checks what the test run named by MPSD_TEST_RUN left behind, and removes
# it: processes, cgroups, temporary directories, test users, and MPS's
# default directories if they appeared during the run. It looks only at
# what it can tie to that run (package internal/testrun), never at other
# processes of the host: a production mpsd, another user's MPS daemons,
# another test run. make test and make chaos run the check themselves, for
# their own run; this is for a script that made its run with the same
# runner (testrun -check).
set -eu
cd "$(dirname "$0")/.."
exec "${GO:-go}" run ./internal/testrun/cmd/testrun -check
