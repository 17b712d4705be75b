// nvml.c: the few NVML calls the benchmark needs, resolved with dlsym at run time.
//
// The prototypes below mirror nvml.h from the NVIDIA driver (stable C ABI since NVML 2.x);
// we declare them ourselves so the build needs neither the header nor the library.
#include "nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *nvml_device;
typedef int nvml_return; // 0: NVML_SUCCESS
enum { NVML_SUCCESS = 0, NVML_ERROR_INSUFFICIENT_SIZE = 7 };
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_TEMPERATURE_GPU = 0 };

struct nvml_memory {
    unsigned long long total, free, used;
};
struct nvml_utilization {
    unsigned gpu, memory;
};
struct nvml_process { // nvmlProcessInfo_t (v2/v3 layout)
    unsigned pid;
    unsigned long long used_gpu_memory;
    unsigned gpu_instance_id, compute_instance_id;
};

static struct {
    bool tried, ok;
    char why[160];
    void *lib;
    nvml_return (*init)(void);
    const char *(*error_string)(nvml_return);
    nvml_return (*handle_by_index)(unsigned, nvml_device *);
    nvml_return (*handle_by_pci)(const char *, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned);
    nvml_return (*uuid)(nvml_device, char *, unsigned);
    nvml_return (*driver)(char *, unsigned);
    nvml_return (*temperature)(nvml_device, int, unsigned *);
    nvml_return (*power)(nvml_device, unsigned *);
    nvml_return (*power_limit)(nvml_device, unsigned *);
    nvml_return (*clock)(nvml_device, int, unsigned *);
    nvml_return (*max_clock)(nvml_device, int, unsigned *);
    nvml_return (*throttle)(nvml_device, unsigned long long *);
    nvml_return (*memory)(nvml_device, struct nvml_memory *);
    nvml_return (*utilization)(nvml_device, struct nvml_utilization *);
    nvml_return (*bus_width)(nvml_device, unsigned *);
    nvml_return (*pstate)(nvml_device, int *);
    nvml_return (*processes)(nvml_device, unsigned *, struct nvml_process *);
} nv;

static pthread_mutex_t nv_lock = PTHREAD_MUTEX_INITIALIZER;

static void *sym(const char *a, const char *b) {
    void *p = dlsym(nv.lib, a);
    if (!p && b) p = dlsym(nv.lib, b);
    return p;
}

int nvml_open(char *msg, size_t msglen) {
    pthread_mutex_lock(&nv_lock);
    if (!nv.tried) {
        nv.tried = true;
        nv.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!nv.lib) {
            snprintf(nv.why, sizeof nv.why, "libnvidia-ml.so.1 not loadable (no NVIDIA driver on this machine?)");
        } else {
            nv.init = (nvml_return(*)(void))sym("nvmlInit_v2", "nvmlInit");
            nv.error_string = (const char *(*)(nvml_return))sym("nvmlErrorString", NULL);
            nv.handle_by_index = (nvml_return(*)(unsigned, nvml_device *))sym("nvmlDeviceGetHandleByIndex_v2",
                                                                              "nvmlDeviceGetHandleByIndex");
            nv.handle_by_pci = (nvml_return(*)(const char *, nvml_device *))sym("nvmlDeviceGetHandleByPciBusId_v2",
                                                                                "nvmlDeviceGetHandleByPciBusId");
            nv.name = (nvml_return(*)(nvml_device, char *, unsigned))sym("nvmlDeviceGetName", NULL);
            nv.uuid = (nvml_return(*)(nvml_device, char *, unsigned))sym("nvmlDeviceGetUUID", NULL);
            nv.driver = (nvml_return(*)(char *, unsigned))sym("nvmlSystemGetDriverVersion", NULL);
            nv.temperature = (nvml_return(*)(nvml_device, int, unsigned *))sym("nvmlDeviceGetTemperature", NULL);
            nv.power = (nvml_return(*)(nvml_device, unsigned *))sym("nvmlDeviceGetPowerUsage", NULL);
            nv.power_limit = (nvml_return(*)(nvml_device, unsigned *))sym("nvmlDeviceGetEnforcedPowerLimit", NULL);
            nv.clock = (nvml_return(*)(nvml_device, int, unsigned *))sym("nvmlDeviceGetClockInfo", NULL);
            nv.max_clock = (nvml_return(*)(nvml_device, int, unsigned *))sym("nvmlDeviceGetMaxClockInfo", NULL);
            nv.throttle = (nvml_return(*)(nvml_device, unsigned long long *))sym(
                "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons");
            nv.memory = (nvml_return(*)(nvml_device, struct nvml_memory *))sym("nvmlDeviceGetMemoryInfo", NULL);
            nv.utilization =
                (nvml_return(*)(nvml_device, struct nvml_utilization *))sym("nvmlDeviceGetUtilizationRates", NULL);
            nv.bus_width = (nvml_return(*)(nvml_device, unsigned *))sym("nvmlDeviceGetMemoryBusWidth", NULL);
            nv.pstate = (nvml_return(*)(nvml_device, int *))sym("nvmlDeviceGetPerformanceState", NULL);
            nv.processes = (nvml_return(*)(nvml_device, unsigned *, struct nvml_process *))sym(
                "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2");
            if (!nv.init || !nv.handle_by_index || !nv.memory) {
                snprintf(nv.why, sizeof nv.why, "libnvidia-ml.so.1 lacks nvmlInit_v2 / nvmlDeviceGetHandleByIndex_v2");
            } else {
                nvml_return r = nv.init();
                if (r != NVML_SUCCESS)
                    snprintf(nv.why, sizeof nv.why, "nvmlInit failed: %s (code %d)",
                             nv.error_string ? nv.error_string(r) : "?", r);
                else
                    nv.ok = true;
            }
        }
    }
    bool ok = nv.ok;
    if (!ok && msg) snprintf(msg, msglen, "%s", nv.why);
    pthread_mutex_unlock(&nv_lock);
    return ok ? 0 : -1;
}

static int device_index(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v && *v >= '0' && *v <= '9') return atoi(v);
    return 0;
}

static int device(nvml_device *d, char *msg, size_t msglen) {
    if (nvml_open(msg, msglen)) return -1;
    nvml_return r = nv.handle_by_index((unsigned)device_index(), d);
    if (r != NVML_SUCCESS) {
        snprintf(msg, msglen, "nvmlDeviceGetHandleByIndex(%d) failed: %s", device_index(),
                 nv.error_string ? nv.error_string(r) : "?");
        return -1;
    }
    return 0;
}

void nvml_read(struct nvml_sample *s) {
    memset(s, 0, sizeof *s);
    nvml_device d;
    if (device(&d, s->reason, sizeof s->reason)) return;
    s->available = true;
    s->index = device_index();
    unsigned u;
    int i;
    if (!nv.name || nv.name(d, s->name, sizeof s->name)) snprintf(s->name, sizeof s->name, "unknown");
    if (!nv.uuid || nv.uuid(d, s->uuid, sizeof s->uuid)) snprintf(s->uuid, sizeof s->uuid, "unknown");
    if (!nv.driver || nv.driver(s->driver, sizeof s->driver)) snprintf(s->driver, sizeof s->driver, "unknown");
    s->temp_c = nv.temperature && !nv.temperature(d, NVML_TEMPERATURE_GPU, &u) ? (int)u : -1;
    s->power_w = nv.power && !nv.power(d, &u) ? u / 1000.0 : -1;
    s->power_limit_w = nv.power_limit && !nv.power_limit(d, &u) ? u / 1000.0 : -1;
    s->sm_clock_mhz = nv.clock && !nv.clock(d, NVML_CLOCK_SM, &u) ? (int)u : -1;
    s->mem_clock_mhz = nv.clock && !nv.clock(d, NVML_CLOCK_MEM, &u) ? (int)u : -1;
    s->sm_clock_max_mhz = nv.max_clock && !nv.max_clock(d, NVML_CLOCK_SM, &u) ? (int)u : -1;
    s->mem_clock_max_mhz = nv.max_clock && !nv.max_clock(d, NVML_CLOCK_MEM, &u) ? (int)u : -1;
    s->mem_bus_bits = nv.bus_width && !nv.bus_width(d, &u) ? (int)u : -1;
    s->pstate = nv.pstate && !nv.pstate(d, &i) ? i : -1;
    unsigned long long t;
    s->throttle = nv.throttle && !nv.throttle(d, &t) ? (long long)t : -1;
    struct nvml_utilization ut;
    s->util_gpu_pct = s->util_mem_pct = -1;
    if (nv.utilization && !nv.utilization(d, &ut)) s->util_gpu_pct = (int)ut.gpu, s->util_mem_pct = (int)ut.memory;
    struct nvml_memory m;
    s->mem_total = s->mem_used = -1;
    if (!nv.memory(d, &m)) s->mem_total = (long long)m.total, s->mem_used = (long long)m.used;
    s->n_processes = -1;
    if (nv.processes) {
        unsigned n = 0;
        nvml_return r = nv.processes(d, &n, NULL);
        if (r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE) s->n_processes = (int)n;
    }
}

int nvml_memory_used(long long *used, long long pid, long long *pid_used) {
    char msg[160];
    nvml_device d;
    *used = -1;
    if (pid_used) *pid_used = -1;
    if (device(&d, msg, sizeof msg)) return -1;
    struct nvml_memory m;
    if (nv.memory(d, &m)) return -1;
    *used = (long long)m.used;
    if (pid_used && nv.processes) {
        struct nvml_process p[64];
        unsigned n = 64;
        if (!nv.processes(d, &n, p))
            for (unsigned i = 0; i < n && i < 64; i++)
                if ((long long)p[i].pid == pid) *pid_used = (long long)p[i].used_gpu_memory;
    }
    return 0;
}

int nvml_other_processes(const char *pci_bus_id, long long self_pid, long long *pid, long long *mem) {
    *pid = *mem = -1;
    nvml_device d;
    if (nvml_open(NULL, 0) || !nv.handle_by_pci || !nv.processes || nv.handle_by_pci(pci_bus_id, &d)) return -1;
    struct nvml_process p[64];
    unsigned n = 64;
    if (nv.processes(d, &n, p)) return -1;
    int others = 0;
    for (unsigned i = 0; i < n && i < 64; i++)
        if ((long long)p[i].pid != self_pid && !others++) {
            *pid = p[i].pid;
            *mem = (long long)p[i].used_gpu_memory;
        }
    return others;
}

void nvml_reason_names(long long bits, char *buf, size_t len) {
    static const struct {
        long long bit;
        const char *name;
    } names[] = {
        {NVML_REASON_GPU_IDLE, "gpu_idle"},
        {NVML_REASON_APP_CLOCKS, "applications_clocks_setting"},
        {NVML_REASON_SW_POWER_CAP, "sw_power_cap"},
        {NVML_REASON_HW_SLOWDOWN, "hw_slowdown"},
        {NVML_REASON_SYNC_BOOST, "sync_boost"},
        {NVML_REASON_SW_THERMAL, "sw_thermal_slowdown"},
        {NVML_REASON_HW_THERMAL, "hw_thermal_slowdown"},
        {NVML_REASON_HW_POWER_BRAKE, "hw_power_brake_slowdown"},
        {NVML_REASON_DISPLAY_CLOCKS, "display_clock_setting"},
    };
    size_t k = 0;
    buf[0] = 0;
    if (bits < 0) {
        snprintf(buf, len, "unknown");
        return;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (bits & names[i].bit) {
            int w = snprintf(buf + k, len - k, "%s%s", k ? "," : "", names[i].name);
            if (w < 0 || (size_t)w >= len - k) return;
            k += (size_t)w;
            bits &= ~names[i].bit;
        }
    if (bits)
        snprintf(buf + k, len - k, "%sother_0x%llx", k ? "," : "", bits);
    else if (!k)
        snprintf(buf, len, "none");
}

double nvml_peak_gbs(const struct nvml_sample *s) {
    if (!s->available || s->mem_clock_max_mhz <= 0 || s->mem_bus_bits <= 0) return 0;
    return 2.0 * s->mem_clock_max_mhz * 1e6 * (s->mem_bus_bits / 8.0) / 1e9;
}
