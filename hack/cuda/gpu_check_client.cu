// gpu_check_client: the well-behaved CUDA client of hack/gpu-check.sh.
//
//   gpu_check_client [--info] [--alloc GIB [--hold]] [--duration SECONDS]
//
// It prints what it sees of the GPU (SM count from
// cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount), memory from
// cudaMemGetInfo) and the MPS environment mps-launch gave it; with --alloc
// it allocates up to GIB GiB in 256 MiB chunks and reports how much
// succeeded (a failed cudaMalloc ends the allocation, not the program);
// then it frees that memory (with --hold: keeps it until it exits, so
// that NVML and mpsd see it held) and runs small kernels for SECONDS.
// --info only prints what it sees.
//
// Lines are "client[PID] WHAT key=value ...", with t= in seconds since the
// epoch, so the script can take timings from them. Exit status: 0 done, 1 a
// CUDA error (such as the sticky error 700 a fault of another client of the
// same MPS server leaves behind), 2 usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
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
	printf("client[%d] error t=%.3f %s: cuda error %d %s: %s\n", getpid(), wall(), what, (int)e, cudaGetErrorName(e),
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

static void usage() {
	fprintf(stderr, "usage: gpu_check_client [--info] [--alloc GIB [--hold]] [--duration SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv) {
	bool info = false, hold = false;
	double alloc_gib = 0, duration = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--info")) {
			info = true;
		} else if (!strcmp(argv[i], "--alloc") && i + 1 < argc) {
			alloc_gib = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--hold")) {
			hold = true;
		} else if (!strcmp(argv[i], "--duration") && i + 1 < argc) {
			duration = atof(argv[++i]);
		} else {
			usage();
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int pid = getpid();
	printf("client[%d] start t=%.3f attempt=%s env_sm=%s env_mem=%s pipe=%s\n", pid, wall(), env("MPSD_ATTEMPT"),
	       env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), env("CUDA_MPS_PIPE_DIRECTORY"));

	cudaError_t e;
	int n = 0;
	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) fail("cudaGetDeviceCount", e);
	cudaDeviceProp p;
	if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) fail("cudaGetDeviceProperties", e);
	int sms = 0;
	if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0)) != cudaSuccess) fail("cudaDeviceGetAttribute", e);
	size_t freeb = 0, total = 0;
	if ((e = cudaMemGetInfo(&freeb, &total)) != cudaSuccess) fail("cudaMemGetInfo", e);
	printf("client[%d] ready t=%.3f attempt=%s sm_count=%d mem_total_mib=%zu mem_free_mib=%zu devices=%d name=%s\n", pid, wall(),
	       env("MPSD_ATTEMPT"), sms, total >> 20, freeb >> 20, n, p.name);
	if (info) return 0;

	std::vector<void *> ptrs; // what --hold keeps until the end
	if (alloc_gib > 0) {
		size_t want = (size_t)(alloc_gib * 1024), got = 0;
		cudaError_t stop = cudaSuccess;
		while (got < want) {
			void *ptr = NULL;
			e = cudaMalloc(&ptr, 256ull << 20);
			if (e != cudaSuccess) {
				stop = e;
				cudaGetLastError(); // an allocation failure is not sticky; clear it
				break;
			}
			ptrs.push_back(ptr);
			got += 256;
		}
		printf("client[%d] alloc t=%.3f requested_mib=%zu got_mib=%zu stopped=%s error=%d %s\n", pid, wall(), want, got,
		       stop == cudaSuccess ? "no" : "yes", (int)stop, stop == cudaSuccess ? "-" : cudaGetErrorName(stop));
		if (!hold) {
			for (void *ptr : ptrs) {
				if ((e = cudaFree(ptr)) != cudaSuccess) fail("cudaFree", e);
			}
			ptrs.clear();
		}
	}

	if (duration > 0) {
		int *out = NULL;
		if ((e = cudaMalloc(&out, sizeof(int))) != cudaSuccess) fail("cudaMalloc", e);
		printf("client[%d] spinning t=%.3f for %.1f s\n", pid, wall(), duration);
		double t0 = mono();
		long kernels = 0;
		while (mono() - t0 < duration) {
			spin<<<sms, 128>>>(1000000ull, out);
			if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
				printf("client[%d] spin failed after %.3f s and %ld kernels\n", pid, mono() - t0, kernels);
				fail("spin kernel", e);
			}
			kernels++;
		}
		printf("client[%d] done t=%.3f spun %.1f s, %ld kernels, ok\n", pid, wall(), mono() - t0, kernels);
	}
	for (void *ptr : ptrs) {
		if ((e = cudaFree(ptr)) != cudaSuccess) fail("cudaFree", e);
	}
	return 0;
}
