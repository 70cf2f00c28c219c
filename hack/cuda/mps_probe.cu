// mps_probe: a tiny CUDA program for hack/gpu-mps-probe.sh, used on real GPU
// hosts to record what MPS does (limits seen by a client, allocation
// failures, fault propagation) so the emulator can copy it.
//
//   mps_probe info              print SM count and memory as this client sees them
//   mps_probe alloc MIB         allocate 256 MiB chunks up to MIB, report where it fails
//   mps_probe spin SECONDS      run short kernels for SECONDS, report the first error
//   mps_probe fault             write through an invalid pointer (illegal address)
//
// Every CUDA failure prints "cuda error <n> <name>: <string>" and exits 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

static void fail(const char *what, cudaError_t e) {
	printf("mps_probe[%d] %s: cuda error %d %s: %s\n", getpid(), what, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
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

static double now() {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: mps_probe info|alloc MIB|spin SECONDS|fault\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) fail("cudaGetDeviceCount", e);
	cudaDeviceProp p;
	if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) fail("cudaGetDeviceProperties", e);
	int sms = 0;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	size_t freeb = 0, total = 0;
	if ((e = cudaMemGetInfo(&freeb, &total)) != cudaSuccess) fail("cudaMemGetInfo", e);
	printf("mps_probe[%d] devices=%d name=%s sm_count=%d prop_sm=%d mem_total_mib=%zu mem_free_mib=%zu\n", getpid(), n, p.name, sms,
	       p.multiProcessorCount, total >> 20, freeb >> 20);
	if (!strcmp(argv[1], "info")) return 0;
	if (!strcmp(argv[1], "alloc") && argc > 2) {
		size_t want = strtoull(argv[2], NULL, 10), got = 0;
		std::vector<void *> ptrs;
		while (got < want) {
			void *ptr = NULL;
			e = cudaMalloc(&ptr, 256ull << 20);
			if (e != cudaSuccess) {
				printf("mps_probe[%d] alloc stopped at %zu MiB\n", getpid(), got);
				fail("cudaMalloc", e);
			}
			ptrs.push_back(ptr);
			got += 256;
		}
		printf("mps_probe[%d] allocated %zu MiB\n", getpid(), got);
		return 0;
	}
	if (!strcmp(argv[1], "spin") && argc > 2) {
		double secs = atof(argv[2]), t0 = now();
		int *out = NULL;
		if ((e = cudaMalloc(&out, sizeof(int))) != cudaSuccess) fail("cudaMalloc", e);
		printf("mps_probe[%d] spinning\n", getpid());
		long iters = 0;
		while (now() - t0 < secs) {
			spin<<<p.multiProcessorCount, 128>>>(1000000ull, out);
			if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
				printf("mps_probe[%d] after %.3f s, %ld kernels\n", getpid(), now() - t0, iters);
				fail("spin kernel", e);
			}
			iters++;
		}
		printf("mps_probe[%d] spun %.1f s, %ld kernels, ok\n", getpid(), now() - t0, iters);
		return 0;
	}
	if (!strcmp(argv[1], "fault")) {
		bad<<<1, 1>>>((int *)0x10);
		e = cudaDeviceSynchronize();
		if (e != cudaSuccess) fail("fault kernel", e);
		printf("mps_probe[%d] fault kernel did not fault\n", getpid());
		return 3;
	}
	fprintf(stderr, "unknown mode %s\n", argv[1]);
	return 2;
}
