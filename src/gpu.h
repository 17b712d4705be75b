// gpu.h: is the GPU a server replica was given free?  (`calla serve --device N`)
//
// One replica per GPU: a replica started on a GPU that another process computes on, or that has
// too little free memory for the weights, must fail at start with a message that says which GPU
// and why, not run at half speed or die in a cudaMalloc half-way through the upload.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// 0 when CUDA device `device` (numbered as CUDA numbers them: within CUDA_VISIBLE_DEVICES) can
// take need_bytes more and, with exclusive, no other process computes on it (NVML's list, when
// NVML is present).  Else -1 with the reason in err.  Without the CUDA backend: always 0.
int gpu_check_free(int device, int64_t need_bytes, bool exclusive, char *err, size_t errlen);
