export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv
echo "== rotation tests"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -rf tests/gpu/test_kbit_gemv_gpu.py -k "rotated or poisoned or matches_reference or graph" tests/gpu/test_gptq_gpu.py 2>&1 | tail -8 | tee $OUT/rot_tests.log
echo "== cost"
timeout 200 python3 benchmarks/tools/rotation_gemv_cost.py --bits 2,3,4 --m 1,4 2>&1 | tee $OUT/rot_cost.log
echo "== e2e"
for r in "" "--rotate"; do timeout 150 python3 -m lowbit generate --model random:llama-3-8b --max-new-tokens 128 $r 2>&1 | grep -v "it/s\]" | tail -12; done 2>&1 | tee $OUT/rot_e2e.log
