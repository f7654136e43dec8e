export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
ls .lowbit_cache
python3 -m pytest -q -p no:cacheprovider -n 6 tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_nvfp4_gpu.py tests/gpu/test_decode_formats_gpu.py 2>&1 | tail -4 > $OUT/tests.log; cat $OUT/tests.log
python3 benchmarks/gemv_sweep.py --bits 2,3 --m 1 --shapes 8192x29568,4096x28672,4096x6144,14336x4096 --no-streamk --global-x 2>&1 | tee $OUT/sweep_m1.log
python3 benchmarks/gemv_sweep.py --bits 2,3 --m 2 --shapes 8192x29568,4096x6144 --no-streamk --global-x 2>&1 | tee $OUT/sweep_m2.log
python3 benchmarks/e2e_gpu.py --model llama-3-8b --variants bf16,kbit4+fuse,kbit3+fuse,kbit2+fuse,kbit3+fuse+lm_head4,kbit4+fuse+lm_head4 --out $OUT/e2e.json 2>&1 | grep "tok/s"
