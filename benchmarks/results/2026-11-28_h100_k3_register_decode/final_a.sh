#!/bin/bash
# the final library: the whole GPU suite, then Llama-3-8B b1 rows (each a process of its own)
LIB=.variants/final.so.xz SUITE=1 SUITE_TIMEOUT=330 \
ROWS="b1:--fresh --model llama-3-8b --batch 1 --variants bf16,torch-int4,kbit4+fuse,kbit3+fuse" \
bash benchmarks/tools/verify_device.sh
