// nvml.h: GPU telemetry through NVML, loaded at run time (dlopen "libnvidia-ml.so.1").
//
// Calla never links NVML: a CPU-only machine has no libnvidia-ml, and bench must still run there.
// Every reading says whether it is available and, when not, why (recorded in the bench JSON).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Clock-event ("throttle") reason bits, as NVML numbers them.
enum {
    NVML_REASON_GPU_IDLE = 0x1,
    NVML_REASON_APP_CLOCKS = 0x2,
    NVML_REASON_SW_POWER_CAP = 0x4,
    NVML_REASON_HW_SLOWDOWN = 0x8,
    NVML_REASON_SYNC_BOOST = 0x10,
    NVML_REASON_SW_THERMAL = 0x20,
    NVML_REASON_HW_THERMAL = 0x40,
    NVML_REASON_HW_POWER_BRAKE = 0x80,
    NVML_REASON_DISPLAY_CLOCKS = 0x100,
};
// Reasons that do not slow a benchmark: idle, clocks pinned by the administrator, display.
#define NVML_REASONS_BENIGN (NVML_REASON_GPU_IDLE | NVML_REASON_APP_CLOCKS | NVML_REASON_DISPLAY_CLOCKS)

// One reading of the device. Fields NVML could not give are -1 (the whole reading is unavailable
// when available is false; reason says why).
struct nvml_sample {
    bool available;
    char reason[160];
    char name[96];
    char uuid[96];
    char driver[80];
    int index; // NVML device index
    int temp_c;
    double power_w, power_limit_w;
    int sm_clock_mhz, mem_clock_mhz, sm_clock_max_mhz, mem_clock_max_mhz;
    int mem_bus_bits;
    int pstate;
    int util_gpu_pct, util_mem_pct;
    long long throttle; // reason bits (-1: unknown)
    long long mem_total, mem_used;
    int n_processes; // compute processes on the device (-1: unknown)
};

// Opens NVML (once per process; later calls are cheap). 0, or -1 with the reason in msg.
int nvml_open(char *msg, size_t msglen);
// Reads the device that CUDA will use (CUDA_VISIBLE_DEVICES's first entry when it is a number,
// else 0). Always fills s; s->available false when NVML is absent or the call failed.
void nvml_read(struct nvml_sample *s);
// Device memory in use (bytes) and the memory of one process (bytes, -1 when unknown). Fast
// enough to poll every few milliseconds. 0, or -1 when unavailable.
int nvml_memory_used(long long *used, long long pid, long long *pid_used);
// Compute processes other than self_pid on the GPU with this PCI bus id ("0000:1B:00.0", as
// cudaDeviceGetPCIBusId writes it): their count, and the first one's pid and memory (bytes, -1
// when unknown).  -1 when NVML cannot tell (absent, or the call failed).
int nvml_other_processes(const char *pci_bus_id, long long self_pid, long long *pid, long long *mem);
// "gpu_idle,sw_power_cap" into buf for the reason bits.
void nvml_reason_names(long long bits, char *buf, size_t len);
// Peak DRAM bandwidth in GB/s from the max memory clock and bus width (DDR: 2 transfers per
// clock), or 0 when unknown.
double nvml_peak_gbs(const struct nvml_sample *s);
