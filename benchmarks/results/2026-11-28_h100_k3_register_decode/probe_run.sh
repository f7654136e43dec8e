#!/bin/bash
# K = 3 register decode: the probe sweep over block masks (bulk and stream-K kernels), outputs compared bit for bit
cd .probe/k3bin
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/device.txt
for mode in bulk local; do
  for heat in cold hot; do
    for m in 0 01 11 15 55 ff; do
      echo "== K3 $mode $heat mask $m" | tee -a $OUT/pp3.txt
      ./pp3_$m $OUT/y_${mode}_${heat}_$m.bin $mode $heat >> $OUT/pp3.txt 2>&1
      if [ $m != 0 ]; then cmp $OUT/y_${mode}_${heat}_0.bin $OUT/y_${mode}_${heat}_$m.bin && echo "y bit-equal to mask 0" | tee -a $OUT/pp3.txt; fi
    done
  done
done
for r in 1 2; do for m in 0 11 55 ff; do echo "== chain K3 mask $m run $r"; ./chain3_$m 4096 14336; done; done > $OUT/chain3.txt 2>&1
./chain4 4096 14336 > $OUT/chain4.txt 2>&1
grep -h 'per chain' $OUT/chain3.txt $OUT/chain4.txt | cut -c1-40,170-
rm -f $OUT/y_*.bin
