export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
python3 -m pytest -q -m gpu tests/gpu/test_attention_gpu.py -x -n 4 2>&1 | tail -15 | tee $OUT/attn_tests.txt
for b in 2 3 4 5; do python3 benchmarks/gemv_sweep.py --bits $b --m 1 --no-warps --shapes 8192x29568,4096x6144,4096x4096,4096x28672,14336x4096,2048x7168 2>&1 | tee $OUT/sweep_b$b.txt; done
