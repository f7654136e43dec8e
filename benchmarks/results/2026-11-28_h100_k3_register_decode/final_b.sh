#!/bin/bash
# batch 4, kbit3: HEAD's library against the final one (the split kernel's register blocks run at every M)
for lib in base final; do
  LIB=.variants/$lib.so.xz ROWS="b4_$lib:--fresh --model llama-3-8b --batch 4 --variants kbit3+fuse,kbit4+fuse" bash benchmarks/tools/verify_device.sh
  mkdir -p $OUT/$lib; mv $OUT/b4_$lib.* $OUT/$lib/ 2>/dev/null
done
