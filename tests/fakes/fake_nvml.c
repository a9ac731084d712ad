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

/* ---- What dpro health reads. Healthy unless FAKE_NVML_FAULTS names faults of GPU 1:
 * ecc (uncorrected volatile errors, a pending remap), xid (XID 79 raised once), pcie (x8 of x16,
 * replays growing), nvlink (link 2 down, CRC errors growing), thermal (at the slowdown threshold).
 * Without FAKE_NVML_FAULTS the throttle reasons above are kept (GPU 1: SW thermal slowdown).
 * Error codes are NVML's: 2 INVALID_ARGUMENT, 3 NOT_SUPPORTED, 10 TIMEOUT. */
#include <stdlib.h>

static int fault(nvmlDevice_t h, const char *name) {
    const char *faults = getenv("FAKE_NVML_FAULTS");
    return faults && INDEX(h) == 1 && strstr(faults, name) != NULL;
}
static unsigned int calls = 0; /* counters that grow read larger each time */

typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { int registered; int delivered; } fakeEventSet_t;
static fakeEventSet_t event_set;

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    (void)h; strncpy(name, "Fake A100-SXM4-80GB", length); return 0;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *r) {
    if (getenv("FAKE_NVML_FAULTS") == NULL) return nvmlDeviceGetCurrentClocksThrottleReasons(h, r);
    *r = fault(h, "thermal") ? 0x20ULL : 0ULL; return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int errorType, int counterType, unsigned long long *count) {
    *count = (errorType == 1 && fault(h, "ecc")) ? 2 : 0; (void)counterType; return 0;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failed) {
    *corr = 0; *unc = fault(h, "ecc") ? 1 : 0; *pending = fault(h, "ecc") ? 1 : 0; *failed = 0; return 0;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t h, int cause, unsigned int *count, unsigned long long *addresses) {
    (void)h; (void)cause; (void)addresses; *count = 0; return 0; /* A100s remap rows instead; none retired */
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    (void)h; *mhz = type == 1 ? 1410 : 1593; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *c) {
    (void)sensor; *c = fault(h, "thermal") ? 90 : 45; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t h, int threshold, unsigned int *c) {
    (void)h; *c = threshold == 1 ? 90 : 95; return 0; /* 1: slowdown */
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) { (void)h; *mw = 400000; return 0; }
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t h, unsigned int *mw) { (void)h; *mw = 400000; return 0; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t h, unsigned int *g) { (void)h; *g = 4; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t h, unsigned int *g) { (void)h; *g = 4; return 0; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t h, unsigned int *w) { *w = fault(h, "pcie") ? 8 : 16; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t h, unsigned int *w) { (void)h; *w = 16; return 0; }
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t h, unsigned int *n) {
    *n = fault(h, "pcie") ? 100 + calls++ : 0; return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t h, unsigned int link, unsigned int *active) {
    if (link >= 12) return 2; /* NVML_ERROR_INVALID_ARGUMENT: an A100 has 12 links */
    *active = !(fault(h, "nvlink") && link == 2); return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t h, unsigned int link, int counter, unsigned long long *v) {
    if (link >= 12) return 2;
    *v = (fault(h, "nvlink") && link == 3 && counter == 2) ? 10 + calls++ : 0; return 0;
}
nvmlReturn_t nvmlEventSetCreate(fakeEventSet_t **set) { event_set.registered = 0; event_set.delivered = 0; *set = &event_set; return 0; }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, fakeEventSet_t *set) {
    (void)h; (void)types; set->registered = 1; return 0;
}
nvmlReturn_t nvmlEventSetWait_v2(fakeEventSet_t *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)timeout_ms;
    if (set->registered && !set->delivered && fault(&devices[1], "xid")) {
        set->delivered = 1;
        memset(data, 0, sizeof *data); data->device = &devices[1]; data->eventType = 8; data->eventData = 79;
        return 0;
    }
    return 10; /* NVML_ERROR_TIMEOUT */
}
nvmlReturn_t nvmlEventSetFree(fakeEventSet_t *set) { (void)set; return 0; }
