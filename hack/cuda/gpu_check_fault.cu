// gpu_check_fault: the faulting CUDA client of hack/gpu-check.sh.
//
//   gpu_check_fault [--after SECONDS] [--duration SECONDS]
//
// On its first run (MPSD_ATTEMPT unset or 1) it runs small kernels for
// SECONDS (--after, default 5), then writes through an invalid device
// pointer: an illegal-address fault, which MPS turns into a sticky error
// 700 for every client of the same MPS server. On a later run (mpsd
// requeued its lease after the fault) it does not fault again: it runs
// small kernels for --duration SECONDS (default 5) and exits 0, so the
// requeued run can finish.
//
// Lines are "fault[PID] WHAT key=value ...", t= in seconds since the epoch.
// Exit status: 1 after the intended fault (or any CUDA error), 0 a later
// attempt that finished, 3 the fault did not fault, 2 usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <cuda_runtime.h>

static double wall() {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double mono() {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *env(const char *name) {
	const char *v = getenv(name);
	return v && *v ? v : "-";
}

static void fail(const char *what, cudaError_t e) {
	printf("fault[%d] error t=%.3f %s: cuda error %d %s: %s\n", getpid(), wall(), what, (int)e, cudaGetErrorName(e),
	       cudaGetErrorString(e));
	fflush(stdout);
	exit(1);
}

__global__ void spin(unsigned long long cycles, int *out) {
	unsigned long long start = clock64();
	while (clock64() - start < cycles) {
	}
	if (threadIdx.x == 0 && blockIdx.x == 0) *out += 1;
}

__global__ void bad(int *p) { *p = 42; }

// spin_for runs small kernels for secs seconds; a CUDA error ends the program.
static long spin_for(double secs, int sms, int *out) {
	double t0 = mono();
	long kernels = 0;
	while (mono() - t0 < secs) {
		spin<<<sms, 128>>>(1000000ull, out);
		cudaError_t e = cudaDeviceSynchronize();
		if (e != cudaSuccess) fail("spin kernel", e);
		kernels++;
	}
	return kernels;
}

int main(int argc, char **argv) {
	double after = 5, duration = 5;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--after") && i + 1 < argc) {
			after = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--duration") && i + 1 < argc) {
			duration = atof(argv[++i]);
		} else {
			fprintf(stderr, "usage: gpu_check_fault [--after SECONDS] [--duration SECONDS]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int pid = getpid();
	const char *attempt = env("MPSD_ATTEMPT");
	bool first = !strcmp(attempt, "-") || !strcmp(attempt, "1");
	printf("fault[%d] start t=%.3f attempt=%s env_sm=%s env_mem=%s\n", pid, wall(), attempt,
	       env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));

	cudaError_t e;
	int sms = 0;
	if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0)) != cudaSuccess) fail("cudaDeviceGetAttribute", e);
	int *out = NULL;
	if ((e = cudaMalloc(&out, sizeof(int))) != cudaSuccess) fail("cudaMalloc", e);
	printf("fault[%d] ready t=%.3f attempt=%s sm_count=%d\n", pid, wall(), attempt, sms);

	if (!first) {
		printf("fault[%d] attempt %s: not faulting again; spinning %.1f s\n", pid, attempt, duration);
		long k = spin_for(duration, sms, out);
		printf("fault[%d] done t=%.3f %ld kernels, ok\n", pid, wall(), k);
		return 0;
	}
	long k = spin_for(after, sms, out);
	printf("fault[%d] faulting now t=%.3f after %ld kernels: writing through an invalid device pointer\n", pid, wall(), k);
	bad<<<1, 1>>>((int *)0x10);
	e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		printf("fault[%d] faulted t=%.3f: cuda error %d %s (as intended)\n", pid, wall(), (int)e, cudaGetErrorName(e));
		return 1;
	}
	printf("fault[%d] the fault kernel did not fault\n", pid);
	return 3;
}
