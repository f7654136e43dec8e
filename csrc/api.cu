// Library-wide C entry points (version, error strings).
#include <cuda_runtime.h>

#include "lowbit.h"

#define LOWBIT_ABI_VERSION 15

extern "C" int lowbit_abi_version(void) { return LOWBIT_ABI_VERSION; }

extern "C" const char* lowbit_error_string(int err) {
    return cudaGetErrorString(static_cast<cudaError_t>(err));
}

// A launcher that returns early after a failed CUDA call (a refused launch, a refused attribute) leaves that
// error as the runtime's last error, and the next kernel launch checked with cudaGetLastError -- lowbit's or
// PyTorch's -- would report it as its own. The Python side calls this before raising; it returns what it cleared.
extern "C" int lowbit_clear_error(void) { return static_cast<int>(cudaGetLastError()); }
