/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for machines without a GPU.
 *
 * It exports the NVML C functions that dpro's GPU sampler reaches through the real pynvml
 * binding (nvidia-ml-py), with the real signatures and struct layouts, and reports two GPUs
 * with fixed readings. Only the driver is replaced: pynvml and dpro run unchanged.
 */
#include <stdint.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; } value;
} nvmlFieldValue_t;

static int devices[2] = {0, 1};
#define INDEX(h) (*(int *)(h))

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "fake NVML error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { *count = 2; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    if (i > 1) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *h = &devices[i];
    return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    u->gpu = 90 + INDEX(h); u->memory = 40; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    (void)h; m->total = 80ULL << 30; m->used = 20ULL << 30; m->free = m->total - m->used; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) { (void)h; *mw = 350000; return 0; }
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    (void)h; *mhz = type == 1 ? 1410 : 1215; return 0; /* NVML_CLOCK_SM is 1 */
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *r) {
    *r = INDEX(h) == 1 ? 0x20ULL : 0ULL; return 0; /* GPU 1: SW thermal slowdown */
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, int counter, unsigned int *kib_s) {
    (void)h; *kib_s = counter == 0 ? 1000 : 2000; return 0;
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int n, nvmlFieldValue_t *values) {
    (void)h;
    for (int i = 0; i < n; i++) { values[i].nvmlReturn = 0; values[i].valueType = 4; values[i].value.ull = 5000 + i; }
    return 0;
}
