// CHECK(call): exit with the file, line and CUDA error string when a runtime call fails (the standalone tools).
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)
