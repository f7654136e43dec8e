// Library-wide C entry points (version, error strings).
#include <cuda_runtime.h>

#include "lowbit.h"

#define LOWBIT_ABI_VERSION 13

extern "C" int lowbit_abi_version(void) { return LOWBIT_ABI_VERSION; }

extern "C" const char* lowbit_error_string(int err) {
    return cudaGetErrorString(static_cast<cudaError_t>(err));
}
