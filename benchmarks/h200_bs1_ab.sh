set -uo pipefail
OUT=$1
bash benchmarks/h200_serving.sh $OUT small_bs1,l8b_bs1 "after" tests 2>&1 | tail -12
bash benchmarks/h200_serving.sh $OUT small_bs1,l8b_bs1 "prev after prev after" 2>&1 | grep "^| "
