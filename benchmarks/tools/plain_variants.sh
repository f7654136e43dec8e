export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for v in ${VARIANTS:-base d2 d6 w4 nodec}; do
  echo "== $v"; export LOWBIT_LIBRARY=$PWD/.variants/lib_plain_$v.so
  python3 benchmarks/nvfp4_sweep.py --shapes 8192x28672,28672x8192,4096x14336 --m 1 --only nvfp4-plain-reg --no-check 2>&1 | grep -v "^NVIDIA" | sed 's/nvfp4_rel_err=nan //'
  python3 benchmarks/w4a4_sweep.py --decode reg --kernel-only 2>&1 | grep -v "^NVIDIA"
done
